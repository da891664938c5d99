# Convenience targets; the README's two commands are ./scripts/demo and ./scripts/test.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint crash soak bench

install:
	./scripts/install

demo:
	./scripts/demo

test:
	./scripts/test

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: install
	$(PY) bench/queue_lifecycle.py

# The whole crash harness of docs/crash-model.md (every crash state, the full mutation check,
# 600-SIGKILL fuzzes in both move strategies), ending with the result table.
crash: install
	$(PY) -m pytest tests/crash -m "slow or not slow" -n 2 -p no:cacheprovider -q
