#!/usr/bin/env bash
# One-command setup, safe to re-run: venv + package, Redis on 127.0.0.1:6379, bubblewrap,
# relocated Apptainer (DESIGN.md §6), podman, the six harness CLIs into a project-local npm prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

step "python venv and package"
bash scripts/setup_python.sh

step "system packages"
bash scripts/setup_apt.sh

step "sandbox user (polar-sandbox)"
bash scripts/setup_sandbox_user.sh

step "redis on 127.0.0.1:6379"
bash scripts/setup_redis.sh

step "apptainer (relocated)"
bash scripts/install_apptainer.sh

step "task image (Debian packages via mmdebstrap, cached)"; bash scripts/build_image.sh

step "podman and the task image as polar-tasks:local"; bash scripts/setup_podman.sh

step "harness CLIs (npm, pinned)"
bash scripts/install_harnesses.sh

step "python harnesses (a venv each, pinned)"
bash scripts/install_python_harnesses.sh

step "openclaw (npm, pinned, on its own node)"
bash scripts/install_openclaw.sh

step "more harness CLIs (npm, pinned, own prefix)"
bash scripts/install_more_harnesses.sh

step "setup done"
