"""Polar's mitmproxy addon: `mitmdump -s polar_mitm/addon.py --set polar_tokenizer=DIR …`.

Order matters: refusal first, then session identity, then routing/rewrite, capture last.
"""
from polar_mitm.auth import SessionAuth
from polar_mitm.capture import Capture
from polar_mitm.guard import Guard
from polar_mitm.router import Router

capture = Capture()
addons = [Guard(), SessionAuth(), Router(capture), capture]
