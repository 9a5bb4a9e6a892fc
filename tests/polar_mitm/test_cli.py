"""`polar proxy` and the addon's option validation, as a user meets them."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx

from polar_mitm.launch import stop, ADDON, PORT_ATTEMPTS, free_port, wait_for_port
from polar_mitm.status_file import INTERVAL_S as STATUS_INTERVAL_S
from polar_mitm.status_file import read_status


def test_polar_proxy_prints_the_harness_environment_and_serves(tmp_path, reference_server, tiny_model_dir):
    p1, p2 = free_port(), free_port()
    dead = f"http://127.0.0.1:{free_port()}"  # a second replica that is not running: calls go to the live one
    cmd = [sys.executable, "-m", "polar.cli", "proxy", "--tokenizer", str(tiny_model_dir),
           "--backend", f"{reference_server},{dead}",
           "--proxy-port", str(p1), "--base-url-port", str(p2), "--confdir", str(tmp_path / "conf"),
           "--capture-dir", str(tmp_path / "cap"), "--status-file", str(tmp_path / "proxy.status.json")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        log = tmp_path / "none.log"
        log.write_text("")
        wait_for_port(p2, proc, log)
        r = httpx.post(f"http://127.0.0.1:{p2}/v1/chat/completions", headers={"authorization": "Bearer cli"},
                       json={"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        # an API key names the session only through its hash: never a file name
        files = list((tmp_path / "cap" / "local").glob("*.jsonl"))
        assert len(files) == 1 and files[0].name.startswith("s-") and "cli" not in files[0].name
        # the status file: this process, its memory, and the one session it now holds a history for
        deadline = time.monotonic() + 3 * STATUS_INTERVAL_S
        while (status := read_status(tmp_path / "proxy.status.json")).get("histories") != 1:
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
        assert status["state"] == "reporting" and status["pid"] == proc.pid
        assert status["rss_bytes"] > 20 * 2**20 and status["history_bytes"] > 0 and status["evicted"] == 0
    finally:
        stop(proc)
    assert read_status(tmp_path / "proxy.status.json") == {"state": "missing"}  # a clean stop removes it
    out = "".join(lines)
    assert f"CA certificate {tmp_path / 'conf' / 'mitmproxy-ca-cert.pem'}" in out
    assert f"export HTTPS_PROXY=http://SESSION:TOKEN@127.0.0.1:{p1}" in out
    assert f"export ANTHROPIC_BASE_URL=http://127.0.0.1:{p2}" in out
    assert f"engine {reference_server} up" in out and f"engine {dead} not answering yet (health probe" in out
    assert (tmp_path / "conf" / "polar-ca-bundle.pem").read_text().count("BEGIN CERTIFICATE") >= 2


def test_polar_proxy_reports_a_bad_model_dir(tmp_path):
    r = subprocess.run([sys.executable, "-m", "polar.cli", "proxy", "--tokenizer", str(tmp_path / "missing"),
                        "--proxy-port", str(free_port()), "--base-url-port", str(free_port()),
                        "--confdir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--tokenizer" in r.stdout + r.stderr and "does not exist" in r.stdout + r.stderr


def test_polar_proxy_needs_a_tokenizer(tmp_path):
    """No silent default model: recording ids with another model's tokenizer would be wrong for every call."""
    r = subprocess.run([sys.executable, "-m", "polar.cli", "proxy", "--backend", "http://127.0.0.1:9",
                        "--confdir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--tokenizer DIR is required" in r.stderr


def test_mitmdump_refuses_bad_options_with_their_name(tmp_path, tiny_model_dir):
    mitmdump = f"{sys.prefix}/bin/mitmdump"
    for option, needle in (("polar_engine=tgi", "polar_engine"), ("polar_backend=ftp://x", "polar_backend"),
                           ("polar_sessions=closed", "polar_sessions"), ("polar_hosts=bad host", "polar_hosts"),
                           ("polar_backend=http://127.0.0.1:1,http://127.0.0.1:1", "listed twice"),
                           ("polar_engine_placement=random", "polar_engine_placement"),
                           ("polar_memory_budget=10000000", "does not hold the prompt caches")):
        r = subprocess.run([mitmdump, "-s", str(ADDON), "--mode", f"regular@127.0.0.1:{free_port()}",
                            "--set", f"confdir={tmp_path}", "--set", f"polar_tokenizer={tiny_model_dir}",
                            "--set", option], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and needle in r.stdout + r.stderr, (option, r.stdout[-500:], r.stderr[-500:])


def test_engine_model_mismatch_is_a_warning(tmp_path):
    """An engine that names its model (SGLang /get_model_info, vLLM /v1/models) unlike the tokenizer directory
    gets a warning at start; one that agrees, or does not say, gets none."""
    import json as json_mod
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from polar_mitm.cli import engine_model_mismatch

    answers = {"/get_model_info": {"model_path": "/models/Qwen3-8B"}}

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json_mod.dumps(answers.get(self.path, {})).encode()
            self.send_response(200 if self.path in answers else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        (tmp_path / "Qwen3-8B").mkdir()
        assert engine_model_mismatch(url, tmp_path / "Qwen3-8B") is None
        warning = engine_model_mismatch(url, "fixtures/tiny-qwen2")
        assert warning and "serves 'Qwen3-8B'" in warning and "tiny-qwen2" in warning
        answers.clear()
        answers["/v1/models"] = {"data": [{"id": "served-alias", "root": "/m/tiny-qwen2"}]}
        assert engine_model_mismatch(url, "fixtures/tiny-qwen2") is None  # vLLM's root names the directory
        answers.clear()
        assert engine_model_mismatch(url, "fixtures/tiny-qwen2") is None  # the engine does not say
    finally:
        server.shutdown()
    assert engine_model_mismatch(f"http://127.0.0.1:{free_port()}", "fixtures/tiny-qwen2") is None  # down


def test_polar_proxy_takes_the_context_the_engine_serves(tmp_path, tiny_model_dir):
    """`polar serve --context-length 20000` over a model whose config.json says 4096: the proxy takes the engine's
    context, so a ~6k-token prompt (Codex and Claude Code send ~18k) reaches the engine (the service path once
    refused every such call: "prompt is 17772 tokens; the model's context is 4096"); --context-length still wins."""
    from polar_serve.launch import reference_server

    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x " * 6000}]}
    with reference_server(tiny_model_dir, None, ("--context-length", "20000")) as engine:
        for extra, status in (((), 200), (("--context-length", "4096"), 400)):
            for _ in range(PORT_ATTEMPTS):  # another test's server may take a port between free_port and the bind
                p1, p2 = free_port(), free_port()
                proc = subprocess.Popen([sys.executable, "-m", "polar.cli", "proxy", "--tokenizer",
                                         str(tiny_model_dir), "--backend", engine, "--proxy-port", str(p1),
                                         "--base-url-port", str(p2), "--confdir", str(tmp_path / "conf"),
                                         "--capture-dir", str(tmp_path / "cap"), *extra],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                lines: list[str] = []
                reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
                reader.start()
                r = None
                try:
                    (log := tmp_path / "none.log").write_text("")
                    wait_for_port(p2, proc, log)
                    r = httpx.post(f"http://127.0.0.1:{p2}/v1/chat/completions",
                                   headers={"authorization": "Bearer c"}, json=body, timeout=120)
                except RuntimeError:  # it exited before listening: the lines say why
                    pass
                finally:
                    alive = proc.poll() is None
                    stop(proc)
                reader.join(10)
                if alive or "address already in use" not in "".join(lines).lower():
                    break
            assert r is not None, "".join(lines)
            assert r.status_code == status, r.text[:300]
            said = "polar proxy: context 20000 tokens (the engine's)" in "".join(lines)
            assert said == (not extra), "".join(lines)
            if status == 400:
                assert "the model's context is 4096 tokens" in r.text, r.text[:300]
