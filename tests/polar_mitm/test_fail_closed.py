"""The proxy fails closed (docs/design.md §2, issue 8): when any of Polar's own steps raises, the harness gets its
provider's 500 (or the stream's error event), an error record is written, and nothing leaves the machine —
checked with listeners bound as the provider hostnames (a private /etc/hosts) and as the reverse target."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from polar_mitm.launch import stop
from polar_traj.capture_reader import read_capture_dicts
from tests.polar_mitm.conftest import needs_root, start_proxy
from tests.polar_mitm.provider_requests import APIS, is_provider_error, provider_request, send, stream_error

FAULT_ADDON = Path(__file__).with_name("fault_addon.py")


def fault_proxy(tmp_path, reference_server, model_dir, provider_host, fault: str):
    listener, hosts = provider_host
    return start_proxy(tmp_path, reference_server, model_dir, "-s", str(FAULT_ADDON),
                       "--set", f"polar_test_fault={fault}", hosts_file=hosts,
                       reverse_target=f"http://{listener.host}:443")


def records_of(proxy) -> list[dict]:
    return [r for f in sorted(proxy.capture_dir.glob("*/*.jsonl")) for r in read_capture_dicts(f)]


def send_or_explain(proc, proxy, req, via: str, session: str, where: str):
    """`send`, and when the connection fails, whether the proxy still runs and the end of its log (CI saw one
    base-URL request closed without an answer, once in a thousand runs)."""
    try:
        return send(proxy, req, via, session=session)
    except httpx.TransportError as e:
        tail = proxy.log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"{where}: {type(e).__name__}: {e}; proxy exit code {proc.poll()}; "
                             f"its log ends:\n{tail}") from e


# Steps before the session is known fail with no record; every later step leaves an error record.
FAULTS = {"guard": False, "auth": False, "parse": True, "prompt": True, "engine_request": True, "reply": True,
          "capture": True}


@needs_root
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failing_step_answers_500_records_and_sends_nothing(fault, tmp_path, reference_server, tiny_model_dir,
                                                               provider_host):
    listener, hosts = provider_host
    before = listener.accepted_before_now()
    proc, proxy = fault_proxy(tmp_path, reference_server, tiny_model_dir, provider_host, fault)
    try:
        for api in APIS:
            for stream in (False, True):
                for via in ("https_proxy", "base_url"):
                    req = provider_request(api, "hello", stream, key=f"k-{api}-{stream}-{via}")
                    where = f"{fault}: {api} stream={stream} via {via}"
                    r = send_or_explain(proc, proxy, req, via, f"run-{api}-{stream}-{via}", where)
                    if r.status_code == 200:  # the stream had begun: it must end in the provider's error event
                        assert stream and fault in ("reply", "capture"), where
                        assert stream_error(api, r.text), f"{where}: no error event in {r.text[-300:]!r}"
                    else:
                        assert r.status_code == 500 and is_provider_error(api, r.json()), f"{where}: {r.text[:300]}"
        # (the first probe connection is the one counted in between)
        assert listener.accepted_before_now() == before + 1, "a request reached a provider host or the reverse target"
        errors = [rec for rec in records_of(proxy) if rec["error"]]
        if FAULTS[fault]:
            assert len(errors) == 16 and not [rec for rec in records_of(proxy) if not rec["error"]]
        else:
            assert errors == []
        log = proxy.log.read_text()
        assert "Traceback" in log and "InjectedFault" in log  # the reason is in the proxy's log
    finally:
        stop(proc)
