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

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .tools .cache
