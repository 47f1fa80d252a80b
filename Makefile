# The whole set-up is `make run` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?= -n auto --dist worksteal

.PHONY: run bytecode test test-unit test-integration test-e2e lint openapi bench bench-quick clean

# uv, a wheel from the package index like every other dependency, installs in seconds what pip
# takes half a minute for (CI's wall time, docs/testing.md §Order); pip installs when uv
# cannot be had. Either resolves the same pyproject.toml.
INSTALL = $(BIN)/python -m pip install --quiet uv && $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python
PIP_INSTALL = $(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(INSTALL) -e . || { $(PIP_INSTALL) -e .; }
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(INSTALL) -e '.[test,bench]' || { $(PIP_INSTALL) -e '.[test,bench]'; }
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/qinglong migrate
	$(BIN)/qinglong token bootstrap
	$(BIN)/qinglong serve --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check app tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# Where PYTHONDONTWRITEBYTECODE is set (CI's image sets it), every service and CLI process the
# suite starts compiled app/ from source again: a quarter of a served stack's start.
# compileall writes its bytecode anyway, once, before the session (docs/testing.md §Order).
bytecode: $(VENV)/.installed-test
	$(BIN)/python -m compileall -q app

test: $(VENV)/.installed-test lint bytecode
	$(BIN)/pytest $(PYTEST_ARGS)

# One tier at a time (docs/testing.md). Unit tests are pure logic: no database, no process of
# ours, one pytest process, seconds.
test-unit: $(VENV)/.installed-test
	$(BIN)/pytest tests/unit -m unit -p no:xdist

test-integration: $(VENV)/.installed-test bytecode
	$(BIN)/pytest $(PYTEST_ARGS) -m integration

test-e2e: $(VENV)/.installed-test bytecode
	$(BIN)/pytest $(PYTEST_ARGS) -m e2e

openapi: $(VENV)/.installed-test
	$(BIN)/python -m app.api.openapi > api-schemas/openapi.json

bench: $(VENV)/.installed-test
	$(BIN)/python -m bench --full

bench-quick: $(VENV)/.installed-test
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
