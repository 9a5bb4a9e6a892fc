"""The proxy's capture (polar_mitm/capture.py): linear records (capture format 2) written by a group commit that
releases a reply only once its record is on disk. Real mitmdump in front of a zero-compute stub engine."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import httpx
import pytest

from polar_mitm.capture import Capture, GroupWriter
from polar_mitm.sessions.registry import hashed_id
from polar_traj.capture_reader import read_capture
from polar_traj.records import append_record
from tests.polar_mitm.conftest import start_proxy, stop
from tests.polar_mitm.stub_engine import StubEngine
from tests.polar_traj.conftest import make_record


@pytest.fixture(scope="module")
def stub(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return StubEngine(tok.encode("fine, thanks", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")])


def chat(messages: list[dict], stream: bool = False) -> dict:
    return {"model": "tiny", "max_tokens": 16, "temperature": 0, "stream": stream, "messages": messages}


def test_a_proxy_killed_right_after_a_reply_has_its_record(tmp_path, stub, tiny_model_dir):
    proc, proxy = start_proxy(tmp_path, stub.url, tiny_model_dir)
    replies: dict[str, list[dict]] = {}  # session -> replies the client received whole, in order
    lock, killed = threading.Lock(), threading.Event()

    def session(n: int) -> None:
        key = f"kill-{n}"
        messages = [{"role": "user", "content": f"hello {n}"}]
        with httpx.Client(timeout=30) as client:
            while not killed.is_set():
                try:
                    r = client.post(proxy.base_url + "/v1/chat/completions", json=chat(messages),
                                    headers={"authorization": f"Bearer {key}"})
                except httpx.HTTPError:
                    return  # the proxy is gone
                assert r.status_code == 200, r.text
                with lock:
                    replies.setdefault(key, []).append(r.json())
                    if sum(map(len, replies.values())) >= 40 and not killed.is_set():
                        os.kill(proxy.pid, signal.SIGKILL)  # at once, from the thread that just got the reply
                        killed.set()
                messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                             {"role": "user", "content": "go on"}]

    threads = [threading.Thread(target=session, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    proc.wait(10)
    assert killed.is_set()
    for key, got in replies.items():
        records = list(read_capture(proxy.capture_dir / "local" / f"{hashed_id(key)}.jsonl"))
        by_id = {r.call_id: r for r in records}
        for reply in got:  # every reply the harness saw is on disk, as it was sent
            assert reply["id"] in by_id, f"{key}: the reply {reply['id']} has no record after the kill"
            assert by_id[reply["id"]].response == reply
        assert [r.prefix_source for r in records[1:]] == ["substituted"] * (len(records) - 1)


def test_the_proxys_linear_capture_reads_back_whole_and_so_does_format_1(tmp_path, stub, tiny_model_dir):
    proc, proxy = start_proxy(tmp_path, stub.url, tiny_model_dir)
    system = {"role": "system", "content": "You are a careful coding agent. " * 40}
    messages, sent, got = [system, {"role": "user", "content": "list the files"}], [], []
    try:
        with httpx.Client(timeout=30) as client:
            for turn in range(4):
                body = chat(list(messages), stream=turn == 2)
                r = client.post(proxy.base_url + "/v1/chat/completions", json=body,
                                headers={"authorization": "Bearer linear"})
                assert r.status_code == 200, r.text
                sent.append(body)
                got.append(None if body["stream"] else r.json())
                messages += [{"role": "assistant", "content": "fine, thanks"},
                             {"role": "user", "content": f"tool output {turn}: " + "a.py b.py " * 20}]
    finally:
        stop(proc)
    path = proxy.capture_dir / "local" / f"{hashed_id('linear')}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(line["capture_version"] == 2 for line in lines)
    assert all("prompt_prefix" in line and "request_base" in line for line in lines[1:])  # history not repeated
    records = list(read_capture(path))
    assert [r.request for r in records] == sent
    assert [r.response for r in records if not r.stream] == [g for g in got if g is not None]
    for parent, child in zip(records, records[1:]):
        assert child.prefix_source == "substituted" and child.parent_call_id == parent.call_id
        assert child.prompt_ids[:len(parent.prompt_ids) + len(parent.output_ids)] == parent.prompt_ids + parent.output_ids
    full = tmp_path / "format1"
    for r in records:
        append_record(full, r)  # what an older proxy wrote
    assert list(read_capture(full / "local" / path.name)) == records
    assert path.stat().st_size * 2 < (full / "local" / path.name).stat().st_size


def test_sessions_with_one_long_system_prompt_store_it_once(tmp_path, stub, tiny_model_dir):
    from transformers import AutoTokenizer

    from polar_traj.captures import MIN_SHARED, shared_files
    from tests.prompt_oracle import assert_prompt_faithful

    proc, proxy = start_proxy(tmp_path, stub.url, tiny_model_dir)
    system = {"role": "system", "content": "You are a careful coding agent. Read before you edit. " * 60}
    try:
        with httpx.Client(timeout=30) as client:
            for n in range(3):
                body = chat([system, {"role": "user", "content": f"task {n}: fix the tests"}])
                r = client.post(proxy.base_url + "/v1/chat/completions", json=body,
                                headers={"authorization": f"Bearer shared-{n}"})
                assert r.status_code == 200, r.text
    finally:
        stop(proc)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    paths = [proxy.capture_dir / "local" / f"{hashed_id(f'shared-{n}')}.jsonl" for n in range(3)]
    firsts = [json.loads(p.read_text().splitlines()[0]) for p in paths]
    assert "prompt_prefix" not in firsts[0] and len(firsts[0]["prompt_ids"]) > MIN_SHARED
    assert firsts[1]["prompt_prefix"]["shared"] == firsts[2]["prompt_prefix"]["shared"]  # one file for all
    assert shared_files(paths[1]) == shared_files(paths[2])
    assert shared_files(paths[1])[0].is_file()
    for p in paths:
        (record,) = read_capture(p)
        assert_prompt_faithful(record, tok)  # the proxy's rendering of the request, id for id
    assert all(p.stat().st_size * 4 < paths[0].stat().st_size for p in paths[1:])


def test_a_cancelled_calls_record_is_written_and_the_writer_goes_on(tmp_path):
    """A call cancelled while its record waits for the writer (its client left mid-call): the record still
    lands, and the writer thread keeps serving the calls after it."""
    capture = Capture()
    capture.writer = writer = GroupWriter(tmp_path)
    gate, commit = threading.Event(), writer._commit
    writer._commit = lambda calls: (gate.wait(10), commit(calls))  # the batch waits until the call is cancelled

    async def main() -> None:
        first = asyncio.create_task(capture.commit(make_record([1, 2, 3], [4], call_id="a", session_id="s1")))
        await asyncio.sleep(0.1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        await asyncio.wait_for(capture.commit(make_record([5, 6], [7], call_id="b", session_id="s2")), 10)

    asyncio.run(main())
    writer.close()
    assert [r.call_id for r in read_capture(tmp_path / "task" / "s1.jsonl")] == ["a"]
    assert [r.call_id for r in read_capture(tmp_path / "task" / "s2.jsonl")] == ["b"]
