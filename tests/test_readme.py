"""The README's commands run as written (issue 26 item 7): every block after a `<!-- runnable -->` mark is run,
in the order it appears, in one fresh folder that sees the repo's fixtures/ and adapters/ (like a checkout's
root); a `<!-- runnable: NAME -->` block is the file NAME that the blocks after it use. Inside `make test`'s
loopback-only namespace, so nothing a harness does reaches past 127.0.0.1."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- runnable(?:: (?P<file>[\w.-]+))? -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)


def runnable_blocks(text: str) -> list[tuple[str | None, str, str]]:
    return [(m["file"], m["lang"], m["body"]) for m in BLOCK.finditer(text)]


def test_the_readme_marks_blocks_to_run() -> None:
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    assert sum(f is None for f, _, _ in blocks) >= 2 and all(lang in ("sh", "yaml") for _, lang, _ in blocks)


@pytest.mark.slow
def test_the_readmes_runnable_blocks_run_as_written(tmp_path: Path) -> None:
    for name in ("fixtures", "adapters"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    ran = 0
    for file, lang, body in runnable_blocks((ROOT / "README.md").read_text()):
        if file:
            (tmp_path / file).write_text(body + "\n")
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)
        printed = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"README block failed (exit {proc.returncode}):\n{body}\n---\n{printed[-4000:]}"
        assert "Traceback" not in printed and "status error" not in printed, printed[-4000:]
        if "--task " in body:  # the demo task with the fixing policy: each runtime scores the fix
            assert printed.count("reward 1,") == body.count("polar run"), printed[-4000:]
        ran += 1
    assert ran >= 2
