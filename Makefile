# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NATIVE := $(VENV)/.native
# the scheduler modules mypyc compiles (goodput/sched/native.py names them): an edit rebuilds them
NATIVE_SRC := setup.py goodput/sched/native.py $(addprefix goodput/sched/core/,model.py queue.py capacity.py eviction.py placement.py policy.py executor.py events.py state.py claims.py reservations.py preemption.py scheduler.py) $(addprefix goodput/sched/sim/,ledger.py simulator.py)

.PHONY: demo test lint format clean venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned here (a CPU build lies on the CI machine's disk); the rest from pyproject.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	# pure Python first (the compile is the next step's, once)
	GOODPUT_PURE_PYTHON=1 $(BIN)/python -m pip install -q -e ".[dev,torch]"
	touch $(STAMP)

# compiled in place (pure Python where mypyc or a C compiler is missing; GOODPUT_PURE_PYTHON=1 forces it)
$(NATIVE): $(STAMP) $(NATIVE_SRC)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(NATIVE)

venv: $(NATIVE)

demo: $(NATIVE)
	$(BIN)/goodput demo

lint: $(STAMP)
	$(BIN)/ruff check goodput tests tools setup.py
	$(BIN)/ruff format --check goodput tests tools setup.py

# tests/sched beside the rest, two pytest processes (tools/run_tests.py); GOODPUT_TEST_SERIAL=1: one
test: $(NATIVE) lint
	$(BIN)/python tools/run_tests.py

format: $(STAMP)
	$(BIN)/ruff format goodput tests tools setup.py
	$(BIN)/ruff check --fix goodput tests tools setup.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache *.so goodput/sched/*.so goodput/sched/*/*.so goodput/sched/native.json
