"""What `make setup` provides: Redis on loopback, bubblewrap and Apptainer sandboxes with only `lo` in
which a host unix socket still works (docs/design.md §6), and the six pinned harness CLIs (§7)."""

import json
import os
import shutil
import socket
import socketserver
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APPTAINER = ROOT / ".tools/apptainer/usr/bin/apptainer"
NPM_BIN = ROOT / ".tools/npm/node_modules/.bin"
HARNESS_PACKAGES = {"codex": "@openai/codex", "claude": "@anthropic-ai/claude-code",
                    "qwen": "@qwen-code/qwen-code", "opencode": "opencode-ai",
                    "gemini": "@google/gemini-cli", "pi": "@mariozechner/pi-coding-agent"}
SETUP_HINT = "run `make setup`"
IS_ROOT = os.geteuid() == 0
# Runs a command as an unprivileged user, to show the sandboxes work rootless.
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "HOME=/tmp"]
# Inside the sandbox the host's /usr is bound read-only, so /usr/bin/python3 is the socket client.
SOCKET_CLIENT = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect('/mnt/echo.sock'); "
                 "s.sendall(b'ping from inside'); print(s.recv(100).decode())")


def ip_command() -> str:
    ip = shutil.which("ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if not ip:
        pytest.skip(f"ip (iproute2) not installed; {SETUP_HINT}")
    return ip


def require(path: Path | str | None, what: str) -> str:
    if not path or not Path(path).exists():
        pytest.skip(f"{what} not installed; {SETUP_HINT}")
    return str(path)


@pytest.fixture(scope="module")
def busybox_rootfs() -> Path:
    require(Path("/bin/busybox"), "busybox-static")
    subprocess.run(["bash", str(ROOT / "scripts/make_busybox_rootfs.sh")], check=True, capture_output=True)
    return ROOT / ".cache/rootfs/busybox"


class _Echo(socketserver.StreamRequestHandler):
    def handle(self):
        self.wfile.write(b"echo: " + self.request.recv(100))


@pytest.fixture
def echo_socket_dir():
    """A directory, readable by anyone, holding echo.sock served by a unix-socket echo server on the host."""
    with tempfile.TemporaryDirectory(prefix="polar-sock-") as d:
        os.chmod(d, 0o755)
        server = socketserver.ThreadingUnixStreamServer(f"{d}/echo.sock", _Echo)
        os.chmod(f"{d}/echo.sock", 0o777)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        yield d
        server.shutdown()
        server.server_close()


def redis_command(sock: socket.socket, *args: str) -> bytes:
    sock.sendall("".join(f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)).encode())
    return sock.recv(200)


def test_redis_server_runs_on_loopback(tmp_path):
    """The suite runs in its own loopback-only namespace, where the host's 127.0.0.1:6379 (started by
    scripts/setup_redis.sh, which checks PING itself) is out of sight: start Debian's redis-server here."""
    from tests.redis_server import redis_server

    with redis_server(tmp_path) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            assert redis_command(s, "PING") == b"+PONG\r\n"
            assert redis_command(s, "CONFIG", "GET", "bind").endswith(b"$9\r\n127.0.0.1\r\n")


def bwrap_command(rootfs: Path, sock_dir: str | None = None) -> list[str]:
    cmd = [require(shutil.which("bwrap"), "bubblewrap"), "--unshare-all", "--die-with-parent",
           "--ro-bind", str(rootfs), "/", "--ro-bind", "/usr", "/usr", "--dev", "/dev", "--proc", "/proc"]
    return cmd + (["--bind", sock_dir, "/mnt"] if sock_dir else [])


def apptainer_command(rootfs: Path, sock_dir: str | None = None) -> list[str]:
    cmd = [require(APPTAINER, "apptainer"), "-s", "exec", "--containall", "--no-home", "--net", "--network", "none",
           "--bind", "/usr:/usr:ro"]
    return cmd + (["--bind", f"{sock_dir}:/mnt"] if sock_dir else []) + [str(rootfs)]


RUNTIMES = {"bwrap": bwrap_command, "apptainer": apptainer_command}
USERS = ["self", "nobody"]


def runner(user: str) -> list[str]:
    if user == "self":
        return []
    if not IS_ROOT:
        pytest.skip("already unprivileged: the 'self' case is the rootless one")
    return AS_NOBODY


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sandbox_sees_only_loopback(runtime, user, busybox_rootfs):
    cmd = runner(user) + RUNTIMES[runtime](busybox_rootfs) + ["/bin/sh", "-c", "echo ok; ip -o link"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "ok"
    assert [line.split(":")[1].strip() for line in lines[1:]] == ["lo"]


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_host_unix_socket_reachable_from_sandbox(runtime, user, busybox_rootfs, echo_socket_dir):
    cmd = (runner(user) + RUNTIMES[runtime](busybox_rootfs, echo_socket_dir)
           + ["/usr/bin/python3", "-c", SOCKET_CLIENT])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "echo: ping from inside"


def test_singularity_alias_for_spython():
    alias = APPTAINER.parent / "singularity"
    require(alias, "apptainer")
    out = subprocess.run([str(alias), "--version"], capture_output=True, text=True, timeout=30)
    assert out.stdout.startswith("apptainer version"), out.stderr


@pytest.fixture(scope="module")
def harness_versions() -> dict[str, subprocess.CompletedProcess]:
    """Every CLI's `--version`, all six at once, in a loopback-only network namespace with a fresh HOME."""
    unshare = ["unshare", "-n"] if IS_ROOT else ["unshare", "-rn"]
    ip = ip_command()
    with tempfile.TemporaryDirectory(prefix="polar-home-", dir=ROOT / ".cache") as home:
        procs = {}
        for cli in HARNESS_PACKAGES:
            binary = NPM_BIN / cli
            if binary.exists():
                script = f'"{ip}" link set lo up && exec "{binary}" --version'
                procs[cli] = subprocess.Popen(unshare + ["env", f"HOME={home}/{cli}", "sh", "-c", script],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        results = {}
        for cli, proc in procs.items():
            out, _ = proc.communicate(timeout=120)
            results[cli] = subprocess.CompletedProcess(proc.args, proc.returncode, out)
        return results


@pytest.mark.parametrize("cli", HARNESS_PACKAGES)
def test_harness_cli_reports_pinned_version_offline(cli, harness_versions):
    pins = json.loads((ROOT / "scripts/harnesses/package.json").read_text())["dependencies"]
    if cli not in harness_versions:
        pytest.skip(f"{NPM_BIN / cli} missing; {SETUP_HINT}")
    result = harness_versions[cli]
    assert result.returncode == 0, result.stdout
    assert pins[HARNESS_PACKAGES[cli]] in result.stdout
