"""The warm fork server (polar_serve/forkserver.py) with polar_serve.launch, as real processes: a forked server
answers like a started one and stops like one, a client it does not match gets a plain process (and a line in
the log saying why), and a forked server never outlives its client or the fork server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from polar_serve.forkserver import ENV_VAR
from polar_serve.launch import ForkedProcess, ServerFailed, reference_server as launch


@pytest.fixture(scope="module")
def forkserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A fork server of this module's own (not the suite's), so stopping it harms no other test."""
    path = str(tmp_path_factory.mktemp("forkserver") / "socket")
    proc = subprocess.Popen([sys.executable, "-m", "polar_serve.forkserver", "--socket", path],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("polar serve forkserver: listening")
    yield proc, path
    proc.terminate()
    proc.wait(30)


@pytest.fixture()
def use(forkserver: tuple[subprocess.Popen[str], str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(ENV_VAR, forkserver[1])
    return forkserver[1]


def generate(url: str) -> list[int]:
    r = httpx.post(url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_forked_server_answers_as_a_started_one_and_stops_as_one(use: str, tiny_model_dir: Path,
                                                                    tmp_path: Path, reference_server: str) -> None:
    pids: list[int] = []
    with launch(tiny_model_dir, log_path=tmp_path / "log", on_start=pids.append) as url:
        assert generate(url) == generate(reference_server)  # greedy: the same tokens as the suite's server
        assert "starting a process" not in (tmp_path / "log").read_text()
        assert parent(pids[0]) != os.getpid()  # forked by the fork server, not started by us
    assert gone_within(pids[0], 5)


def test_the_exit_status_and_error_of_a_forked_server_are_its_own(use: str, tmp_path: Path) -> None:
    with pytest.raises(ServerFailed, match=r"(?s)\(exit 2\).*not a model directory") as failed:
        with launch(tmp_path / "nothing", log_path=tmp_path / "log", timeout=60):
            pass
    assert "starting a process" not in str(failed.value)  # it was the forked child that said so


def test_a_client_the_fork_server_does_not_match_gets_a_process(use: str, tiny_model_dir: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # read at import time: a fork would not honour it
    pids: list[int] = []
    with launch(tiny_model_dir, log_path=tmp_path / "log", on_start=pids.append) as url:
        assert len(generate(url)) == 4
        log = (tmp_path / "log").read_text()
        assert "refused: another value of HF_HOME, which imports read" in log and "starting a process" in log
        assert parent(pids[0]) == os.getpid()


def test_a_forked_server_goes_with_its_client(use: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    client = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from polar_serve.launch import reference_server
        with reference_server({str(tiny_model_dir)!r}, on_start=lambda pid: print(pid, flush=True)) as url:
            print(url, flush=True)
            time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    pid = int(client.stdout.readline())
    assert client.stdout.readline().startswith("http://127.0.0.1:")
    assert alive(pid)
    client.kill()  # no cleanup runs: only the closed connection tells the fork server
    client.wait()
    assert gone_within(pid, 10)


def test_forked_servers_go_with_the_fork_server(tiny_model_dir: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "socket")
    server = subprocess.Popen([sys.executable, "-m", "polar_serve.forkserver", "--socket", path],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().startswith("polar serve forkserver: listening")
    monkeypatch.setenv(ENV_VAR, path)
    pids: list[int] = []
    with launch(tiny_model_dir, log_path=tmp_path / "log", on_start=pids.append) as url:
        assert len(generate(url)) == 4
        server.send_signal(signal.SIGKILL)  # the hardest stop: PR_SET_PDEATHSIG takes its children
        server.wait()
        assert gone_within(pids[0], 10)
        with pytest.raises(httpx.TransportError):
            generate(url)


def test_a_forked_process_reports_a_signal_as_popen_does(use: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    from polar_serve import launch as launch_module

    with open(tmp_path / "log", "w+") as log:
        proc = launch_module._forked(["serve", "--model", str(tiny_model_dir), "--host", "127.0.0.1", "--port",
                                      "0"], {**os.environ, "HF_HUB_OFFLINE": "1",
                                             "TOKENIZERS_PARALLELISM": "false"}, log)
        assert isinstance(proc, ForkedProcess)
        assert proc.stdout.readline().startswith("polar serve: listening on ")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.2)
        proc.terminate()
        assert proc.wait(10) == -signal.SIGTERM
        proc.stdout.close()


def test_what_importing_torch_set_in_a_client_is_no_difference(use: str, tiny_model_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo  # noqa: F401 — sets TORCHINDUCTOR_CACHE_DIR here, as transformers' imports did there

    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with launch(tiny_model_dir, log_path=tmp_path / "log") as url:
        assert len(generate(url)) == 4
    assert "starting a process" not in (tmp_path / "log").read_text()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # another value is a difference
    with launch(tiny_model_dir, log_path=tmp_path / "log2") as url:
        assert len(generate(url)) == 4
    assert "refused: another value of TORCHINDUCTOR_CACHE_DIR" in (tmp_path / "log2").read_text()


def test_a_malformed_request_is_refused_and_the_fork_server_goes_on(use: str, tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    import json
    import socket

    for request in ([1, 2], {"args": "serve", "env": {}, "cwd": "/"}, {"args": [], "env": {"A": 1}, "cwd": "/"}):
        read_fd, write_fd = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(use)
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [write_fd, write_fd])
            assert json.loads(conn.makefile().readline()) == {"refused": "a malformed request"}
        os.close(read_fd)
        os.close(write_fd)
    with launch(tiny_model_dir, log_path=tmp_path / "log") as url:  # still serving
        assert len(generate(url)) == 4
    assert "starting a process" not in (tmp_path / "log").read_text()
