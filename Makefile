# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format clean venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned here (a CPU build lies on the CI machine's disk); the rest from pyproject.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev,torch]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/goodput demo

lint: $(STAMP)
	$(BIN)/ruff check goodput tests
	$(BIN)/ruff format --check goodput tests

test: $(STAMP) lint
	$(BIN)/python -m pytest -q tests

format: $(STAMP)
	$(BIN)/ruff format goodput tests
	$(BIN)/ruff check --fix goodput tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
