# Two commands: `make run` (set up, start the broker, run the example agent loop, keep serving)
# and `make test` (the whole suite). Everything lives in ./.venv and ./.firepool ($FIREPOOL_HOME).
# `make run PORT=8081 HOST=0.0.0.0` serves elsewhere; the demo prints the URL it used.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: run test lint venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m examples.run_demo --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite runs on TEST_WORKERS pytest-xdist workers: most tests wait on broker and pod
# processes, so three keep a two-core machine busy. A test file stays on one worker
# (--dist loadfile), so a broker its tests share starts once.
TEST_WORKERS ?= 3

test: $(STAMP) lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .firepool .pytest_cache .mypy_cache .ruff_cache
