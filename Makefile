# Two commands matter on a fresh machine: `make demo` and `make test`.
# Both create the virtualenv (.venv) and install the project with its dev extras first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test demo lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# setup.py builds the compiled loops (fedforest_secure/_ckernels*.[ch]): a change to them reinstalls;
# where a C compiler and Python's headers are there they must compile (else numpy runs them)
CAN_BUILD := command -v cc >/dev/null 2>&1 && $(BIN)/python -c "import os, sysconfig; \
	raise SystemExit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))"
$(STAMP): pyproject.toml setup.py $(wildcard fedforest_secure/_ckernels*.[ch]) | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	FEDFOREST_REQUIRE_KERNELS=$$($(CAN_BUILD) && echo 1 || echo 0) \
	    $(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# the packages byte-compiled first: the tests start ~110 server and client processes, and
# each would compile them again where the environment sets PYTHONDONTWRITEBYTECODE;
# worksteal: a worker that runs out of tests takes half of the other's queue
test: install
	$(BIN)/python -m compileall -q $(LINT_PACKAGES)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

demo: install
	$(BIN)/fedforest simulate --dataset breast_cancer --clients 4 --profile secure

# ruff on every package, the tests and the benchmarks; mypy --strict on the packages; the
# import contract of pyproject.toml ([tool.importlinter]). Every step runs; any failure fails.
LINT_PACKAGES := fedforest_secure server_app client_app fedforest_cli
lint: install
	@rc=0; \
	$(BIN)/ruff check $(LINT_PACKAGES) tests benchmarks || rc=1; \
	$(BIN)/mypy --strict $(LINT_PACKAGES) || rc=1; \
	$(BIN)/lint-imports || rc=1; \
	exit $$rc

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache fedforest-run
