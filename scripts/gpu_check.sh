#!/usr/bin/env bash
# The async GPU path (issue 46 item 6): TRL's AsyncGRPOTrainer trained on Polar's rollouts for a few steps on a lent
# GPU, printing a line per step (scripts/gpu_check.py). Not part of `make test`. Needs what `make setup` installs
# (.venv with the serve and trl extras, Redis, bubblewrap) plus CUDA torch and the flash-attn3 kernel; each missing
# piece is named in one line. Loopback only, like the suite.
#   scripts/gpu_check.sh [--model DIR] [--steps 5]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || { echo "gpu_check: $py not found: run make setup (or set PYTHON)" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
  || { echo "gpu_check: no nvidia-smi: this needs a GPU machine" >&2; exit 2; }
"$py" - <<'PY' || exit 2
import importlib.util, sys
import torch
missing = [m for m in ("trl", "flash_attn_interface") if importlib.util.find_spec(m) is None]
if not torch.cuda.is_available() or missing:
    print(f"gpu_check: cuda {torch.cuda.is_available()}, missing {missing or 'nothing'}: AsyncGRPOTrainer needs "
          "CUDA torch, trl and the flash-attn3 kernel (flash_attn_interface)", file=sys.stderr)
    sys.exit(1)
PY
export HF_HUB_OFFLINE=1
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
exec "${ns[@]}" bash -c 'ip link set lo up && exec "$@"' _ "$py" scripts/gpu_check.py "$@"
