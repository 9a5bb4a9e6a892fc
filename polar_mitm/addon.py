"""Polar's mitmproxy addon: `mitmdump -s polar_mitm/addon.py --set polar_tokenizer=DIR …`.

One addon (polar_mitm/pipeline.py) runs the stages in order — egress backstop, refusal, session identity,
routing/rewrite, capture — and fails closed when any of them raises.
"""
from polar_mitm.pipeline import Polar

addons = [Polar()]
