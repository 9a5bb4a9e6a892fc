"""Packaging: PyTorch is the `polar[serve]` extra. Without it (`import torch` blocked by a sitecustomize, as on
a rollout node that ran a plain `pip install polar`), `polar serve` names the extra to install, while the
proxy's model (tokenizer + chat template) and the workers' Celery app still load."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# None in sys.modules: `import torch` raises ImportError and importlib.util.find_spec("torch") is None,
# as when it is not installed (transformers then runs its tokenizers without it).
BLOCKER = "import sys\nsys.modules['torch'] = None\n"


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("no-torch")
    (site / "sitecustomize.py").write_text(BLOCKER)
    return dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="1")


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_blocker_blocks(no_torch_env):
    done = python("import torch", no_torch_env)
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr and "torch" in done.stderr


def test_serve_names_the_extra_without_torch(no_torch_env, tiny_model_dir):
    done = subprocess.run([sys.executable, "-m", "polar.cli", "serve", "--model", str(tiny_model_dir), "--port", "0"],
                          cwd=ROOT, env=no_torch_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'polar[serve]'" in done.stderr and "Traceback" not in done.stderr


def test_proxy_model_and_workers_load_without_torch(no_torch_env, tiny_model_dir):
    code = (f"from polar_mitm.tokens.model import load_model\n"
            f"m = load_model({str(tiny_model_dir)!r}, 'hermes', 'think')\n"
            f"print(len(m.tokenizer.encode('hello polar')))\n"
            f"import polar_mitm.addon, polar_traj.pipeline, polar.report.cli, workers\n"
            f"from workers.celery_app import app\n"
            f"import sys; print(any(k.startswith('torch.') for k in sys.modules))")
    done = python(code, no_torch_env)
    assert done.returncode == 0, done.stderr[-3000:]
    count, torch_loaded = done.stdout.split()[-2:]
    assert int(count) > 0 and torch_loaded == "False"
