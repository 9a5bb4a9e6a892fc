"""Why a run ended in error, from what it left in its folder: read by `polar run`'s summary and by the report."""
from __future__ import annotations

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
    return lines


def _tail(path: Path, n: int) -> list[str]:
    """The last `n` lines of a file the harness (or the proxy) may have made huge."""
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - 64 * 1024))
        return f.read().decode(errors="replace").splitlines()[-n:]
