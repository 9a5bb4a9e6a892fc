"""Why a run ended in error, from what it left in its folder: read by `polar run`'s summary and by the report."""
from __future__ import annotations

import re
from pathlib import Path


def cause_lines(out: Path, files: list[Path], tail: int = 5) -> list[str]:
    """Why a run ended in error, from what it left: engines the proxy found down, the LLM calls' errors (engine
    down, a prompt over the context with both numbers) and the last lines the harness wrote to stderr."""
    from polar_traj.capture_reader import read_capture

    lines = []
    log = out / "logs" / "proxy.log"
    if not log.is_file():
        log = out / "services" / "logs" / "proxy.log"  # polar run --task keeps its services apart
    if log.is_file():
        lines += [line.strip() for line in _tail(log, 200)
                  if line.startswith("polar proxy: engine ") and " down" in line]
    errors = [r.error for f in files if f.is_file() for r in read_capture(f) if r.error]
    if errors:
        lines.append(f"LLM calls with an error: {len(errors)}; last: {' '.join(str(errors[-1]).split())[:300]}")
    stderr = [line for line in _tail(out / "harness.stderr", tail * 4) if line.strip()][-tail:]
    if stderr:
        lines.append("harness stderr (last lines):")
        lines += [f"  {line[:300]}" for line in stderr]
    lines += [host_file_hint(path) for path in unseen_host_files(stderr, out)]
    return lines


HOST_PATH = re.compile(r"(/[\w.+@-]+(?:/[\w.+@-]+)+)")


def unseen_host_files(stderr: list[str], out: Path) -> list[str]:
    """Absolute paths the harness could not find that exist on this host, outside the sample's folder and the
    system folders every sandbox has: a custom agent's script the sandbox never saw (it sees its image or a
    minimal view of the host, the harness CLIs and its own folders)."""
    found: list[str] = []
    for line in stderr:
        if "no such file" not in line.lower() and "not found" not in line.lower():
            continue
        for path in HOST_PATH.findall(line):
            where = Path(path)
            if path not in found and where.exists() and not where.is_relative_to(out) and \
                    not any(where.is_relative_to(seen) for seen in SANDBOX_SEES):
                found.append(path)
    return found[:3]


# What every sandbox sees of the host (or of its image) at the same paths: a missing file there is no host file
SANDBOX_SEES = tuple(Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/proc", "/dev"))


def host_file_hint(path: str) -> str:
    return (f"{path} is a file on this host, which the sandbox does not see: list it under the adapter's "
            "`files:` (copied into the sandbox; adapters/README.md) or run with --runtime local (no isolation)")


def _tail(path: Path, n: int) -> list[str]:
    """The last `n` lines of a file the harness (or the proxy) may have made huge."""
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - 64 * 1024))
        return f.read().decode(errors="replace").splitlines()[-n:]
