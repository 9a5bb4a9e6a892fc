"""Polar's mitmproxy addon: `mitmdump -s polar_mitm/addon.py --set polar_tokenizer=DIR …`.

One addon (polar_mitm/pipeline.py) runs the stages in order — egress backstop, refusal, session identity,
routing/rewrite, capture — and fails closed when any of them raises.
"""
if __name__ != "polar_mitm.addon":  # loaded by `mitmdump -s` (as "addon"): the process is the proxy, no more
    from polar_mitm.tokens.model import without_torch

    without_torch()

from polar_mitm.pipeline import Polar  # noqa: E402

addons = [Polar()]
