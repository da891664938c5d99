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
