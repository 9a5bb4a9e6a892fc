"""A proxy started before its engines (or while every engine's health probe fails) keeps each session on one
replica: no call moves a session when nothing better is up, so its chain holds. Real mitmdump in front of two
zero-compute stub engines on 127.0.0.1."""
from __future__ import annotations

import asyncio

import pytest

from tests.polar_mitm.conftest import free_port, start_proxy, stop
from tests.polar_mitm.stub_engine import StubEngine
from tests.polar_mitm.engines.test_replicas import records, run_sessions


@pytest.fixture(scope="module")
def reply_ids(tiny_model_dir) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return tok.encode("fine, thanks", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def check_sessions(proxy, names: list[str], engines: set[str]) -> None:
    for name in names:
        recs = records(proxy, name)
        assert len(recs) == 3 and all(r.error is None for r in recs), name
        assert len({r.engine for r in recs}) == 1, f"{name} was served by {[r.engine for r in recs]}"
        assert [r.prefix_source for r in recs[1:]] == ["substituted", "substituted"], name
        assert recs[0].engine in engines


@pytest.mark.parametrize("grace", ["default", "none"])
def test_a_proxy_started_before_its_engines_keeps_each_session_on_one_replica(tmp_path, tiny_model_dir, reply_ids,
                                                                                grace):
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    extra = ["--set", "polar_engine_probe_interval=1"]
    if grace == "none":  # every probe fails and counts: both replicas are down when the calls come
        extra += ["--set", "polar_engine_start_grace=0"]
    proc, proxy = start_proxy(tmp_path, ",".join(urls), tiny_model_dir, *extra)
    try:
        stubs = [StubEngine(reply_ids, port) for port in ports]
        if grace == "none":
            for stub in stubs:
                stub.health = 503  # still reloading weights, say: the probes keep failing
        names = [f"start-{i}" for i in range(20)]
        asyncio.run(run_sessions(proxy.base_url, names, turns=3))
        check_sessions(proxy, names, set(urls))
        assert "moves from" not in proxy.log.read_text()
    finally:
        stop(proc)
