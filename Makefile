# Quick start: `make run` (main job) and `make test` (test suite).
# Each target creates .venv and installs what it needs, idempotently.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# torch is a test-only reference; 2.13.0 is a CPU build (install it first so that
# no dependency pulls a CUDA build).
$(VENV)/.test: pyproject.toml $(VENV)/.core
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.core
	$(BIN)/python -m jaxcd demo

# one worker process per core (at most 4), whole test files per worker (module fixtures
# such as the loaded model are built once per file); `pytest -q tests` runs it serially
test: $(VENV)/.test
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile tests

clean-venv:
	rm -rf $(VENV)
