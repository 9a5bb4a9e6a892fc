"""The model families' reference libraries (scripts/install_reference_libs.sh), each on its own venv: an oracle
script under tests/ runs there, reads one JSON request on stdin and answers one JSON object on stdout."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_oracle(library: str, script: str, request: dict[str, Any]) -> dict[str, Any]:
    """tests/`script` on .tools/`library`-venv's python with `request`; its answer."""
    python = ROOT / ".tools" / f"{library}-venv" / "bin" / "python"
    assert python.is_file(), f"{python}: no {library}; run `make setup` (scripts/install_reference_libs.sh)"
    done = subprocess.run([str(python), str(ROOT / "tests" / script)], capture_output=True, text=True,
                          input=json.dumps(request), timeout=300)
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)
