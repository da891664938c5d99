# Convenience targets; the README's two commands are ./scripts/demo and ./scripts/test.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint crash soak flows bench

install:
	./scripts/install

demo:
	./scripts/demo

test:
	./scripts/test

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Every benchmark, each against a baseline measured in the same run, reported as ratios.
bench: install
	$(PY) bench/queue_lifecycle.py
	$(PY) bench/barrier_overlap.py
	$(PY) bench/policy.py
	$(PY) bench/tools.py
	$(PY) bench/workers.py
	$(PY) bench/cli_startup.py

# The long runs the default suite only samples: every test marked slow (the 8 x 1000 worker
# kill fuzz, the 100 000-job claim, the exhaustive crash sweep).
soak: install
	$(PY) -m pytest -m slow -n 2 -p no:cacheprovider -q

# Every acceptance flow (tests/acceptance/test_acceptance_flows_*.py): the default suite runs a
# twentieth of their files, a different twentieth at each commit (tests/conftest.py).
flows: install
	$(PY) -m pytest tests/acceptance --flows=all -k test_acceptance_flows_ -n 2 -p no:cacheprovider -q

# The whole crash harness of docs/crash-model.md (every crash state, the full mutation check,
# 600-SIGKILL fuzzes in both move strategies), ending with the result table.
crash: install
	$(PY) -m pytest tests/crash -m "slow or not slow" -n 2 -p no:cacheprovider -q
