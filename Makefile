# Two commands matter: `make demo` and `make test`. Both set up first (idempotent, in layers:
# scripts/setup.sh demo installs only what the demo runs; all, what the tests need too).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-demo demo test bench clean

setup:
	@bash scripts/setup.sh all

setup-demo:
	@bash scripts/setup.sh demo

demo: setup-demo
	@$(PY) scripts/demo.py

# setup (all) + the suite, each phase timed on the last line (scripts/make_test.sh).
test:
	@bash scripts/make_test.sh

# Every bench in one loopback-only namespace -> bench/results.md + bench/results.json (LiteLLM, for
# bench/peers.py, goes into its own venv under .tools/ first; skipped with a line if it cannot install).
bench: setup
	@bash bench/setup_litellm.sh
	@$(PY) bench/results.py

clean:
	rm -rf $(VENV) .tools .cache
