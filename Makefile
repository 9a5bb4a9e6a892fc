# Two commands matter: `make demo` and `make test`. Both set up first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) scripts/demo.py

test: setup
	@bash scripts/test.sh

# Every bench in one loopback-only namespace -> bench/results.md + bench/results.json (LiteLLM, for
# bench/peers.py, goes into its own venv under .tools/ first; skipped with a line if it cannot install).
bench: setup
	@bash bench/setup_litellm.sh
	@$(PY) bench/results.py

clean:
	rm -rf $(VENV) .tools .cache
