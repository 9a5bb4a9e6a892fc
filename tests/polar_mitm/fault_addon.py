"""Loaded beside Polar's addon (`mitmdump -s addon.py -s fault_addon.py --set polar_test_fault=NAME`) to make
one of Polar's own steps raise inside the running proxy: the fail-closed tests check what the harness and
the network see then."""
from __future__ import annotations

from mitmproxy import ctx

from polar_mitm import capture
from polar_mitm.calls import dispatch, streaming
from polar_mitm.gate import auth, guard
from polar_mitm.providers import CODECS
from polar_mitm.tokens import prompt


class InjectedFault(RuntimeError):
    pass


def _boom(*args, **kwargs):
    raise InjectedFault("injected by the fail-closed test")


def _patch(name: str) -> None:
    if name == "guard":
        guard.match_route = _boom
    elif name == "auth":
        auth.SessionAuth._resolve = _boom
    elif name == "parse":
        for codec in CODECS.values():
            codec.parse_request = _boom
    elif name == "prompt":
        prompt.SessionHistory.build_prompt = _boom
    elif name == "engine_request":
        dispatch.engine_request = _boom
    elif name == "reply":
        for codec in CODECS.values():
            codec.render_response = _boom
        streaming.StreamTranslator.feed = _boom
    elif name in ("capture", "capture_once"):
        real = capture.CaptureWriter.write_many
        state = {"failed": False}

        def write_many(self, items):
            # fails the call's own record; lets the error record through (so it can be checked)
            if any(r.error is None for r, _ in items) and not (name == "capture_once" and state["failed"]):
                state["failed"] = True
                raise InjectedFault("disk on fire")
            return real(self, items)

        capture.CaptureWriter.write_many = write_many
    elif name:
        raise ValueError(f"unknown fault {name!r}")


class Fault:
    def load(self, loader) -> None:
        loader.add_option("polar_test_fault", str, "", "Which Polar step raises (tests only).")

    def configure(self, updated) -> None:
        if "polar_test_fault" in updated:
            _patch(ctx.options.polar_test_fault)


addons = [Fault()]
