# layout_algebra developer commands. `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast typecheck lint bench check clean

venv: $(STAMP)

# torch first, pinned to the CPU wheel; the project then declares only a range.
# The editable install is a plain path entry (compat mode), which type checkers follow:
# mypy on a planner outside the repository finds the package and its py.typed.
# torchtitan is a test oracle only; its declared dependencies (datasets, wandb, ...) are
# its trainer's, not its models' or parallelize functions', so only what those import.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		--config-settings editable_mode=compat -e '.[torch,testing,dev]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
		torchtitan==0.3.0 spmd_types==0.2.3 tyro==1.0.17 docstring_parser==0.18.0 triton==3.9.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m layout_algebra demo

typecheck: $(STAMP)
	$(BIN)/mypy

test: typecheck
	$(BIN)/python -m pytest -q

# Day-to-day: everything but the tests that spawn real gloo processes.
test-fast: typecheck
	$(BIN)/python -m pytest -q -m "not distributed"

lint: $(STAMP)
	$(BIN)/ruff check layout_algebra tests
	$(BIN)/ruff format --check layout_algebra tests

bench: $(STAMP)
	$(BIN)/python -m tests.bench

check: lint test

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .hypothesis
