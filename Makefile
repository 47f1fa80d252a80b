# The whole set-up is `make run` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?= -n auto --dist worksteal

.PHONY: run test test-unit test-integration test-e2e lint openapi bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/qinglong migrate
	$(BIN)/qinglong token bootstrap
	$(BIN)/qinglong serve --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check app tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(VENV)/.installed-test lint
	$(BIN)/pytest $(PYTEST_ARGS)

# One tier at a time (docs/testing.md). Unit tests are pure logic: no database, no process of
# ours, one pytest process, seconds.
test-unit: $(VENV)/.installed-test
	$(BIN)/pytest tests/unit -m unit -p no:xdist

test-integration: $(VENV)/.installed-test
	$(BIN)/pytest $(PYTEST_ARGS) -m integration

test-e2e: $(VENV)/.installed-test
	$(BIN)/pytest $(PYTEST_ARGS) -m e2e

openapi: $(VENV)/.installed-test
	$(BIN)/python -m app.api.openapi > api-schemas/openapi.json

bench: $(VENV)/.installed-test
	$(BIN)/python -m bench --full

bench-quick: $(VENV)/.installed-test
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
