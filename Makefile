# Two commands matter on a fresh machine: `make demo` and `make test`.
# Both create the virtualenv (.venv) and install the project with its dev extras first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test demo lint bench clean

# pyproject.toml's requires-python (tests/test_makefile.py checks they agree)
MIN_PYTHON := 3.11
# $(call NEED_PYTHON,interpreter,what it is,what to do): exits 1 with a message saying what
# to do unless the interpreter is Python $(MIN_PYTHON) or later
# (the texts are passed as arguments, so an interpreter named with spaces or double quotes,
# PYTHON='"/opt/my py/python3"', is not read as Python code)
NEED_PYTHON = $(1) -c 'import sys; need = tuple(map(int, sys.argv[1].split("."))); \
	sys.exit(None if sys.version_info >= need else "%s Python %d.%d; FedForest Secure needs \
	Python %s or later. %s" % (sys.argv[2], *sys.version_info[:2], sys.argv[1], sys.argv[3]))' \
	$(MIN_PYTHON) '$(2)' '$(3)'
AGAIN := make $(or $(MAKECMDGOALS),install) PYTHON=python$(MIN_PYTHON)

$(BIN)/python:
	@$(call NEED_PYTHON,$(PYTHON),$(PYTHON) is,Name a newer one: $(AGAIN))
	$(PYTHON) -m venv $(VENV)

# setup.py builds the compiled loops (fedforest_secure/_ckernels*.[ch]): a change to them reinstalls;
# where a C compiler and Python's headers are there they must compile (else numpy runs them)
CAN_BUILD := command -v cc >/dev/null 2>&1 && $(BIN)/python -c "import os, sysconfig; \
	raise SystemExit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))"
$(STAMP): pyproject.toml setup.py $(wildcard fedforest_secure/_ckernels*.[ch]) | $(BIN)/python
	@$(call NEED_PYTHON,$(BIN)/python,$(VENV) was made by,Remove it and make it again \
	with a newer one: rm -rf $(VENV); $(AGAIN))
	$(BIN)/python -m pip install --quiet --upgrade pip
	FEDFOREST_REQUIRE_KERNELS=$$($(CAN_BUILD) && echo 1 || echo 0) \
	    $(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# the packages byte-compiled first: the tests start ~250 server and client processes, and
# each would compile them again where the environment sets PYTHONDONTWRITEBYTECODE;
# pytest runs with PYTHONDONTWRITEBYTECODE empty: it keeps the test modules it rewrote for
# their asserts (tests/__pycache__/*-pytest-*.pyc), which each of its worker processes would
# otherwise rewrite again in every run (about 6 s of CPU each, half of its collection);
# TEST_WORKERS: one more test process than the 2 cores of the machine the suite is sized for,
# as many tests spend their time waiting on their servers and clients (round deadlines,
# restarts, long polls) while the cores are free: docs/benchmarks.md, "The test suite";
# worksteal: a worker that runs out of tests takes half of another's queue
TEST_WORKERS ?= 3
test: install
	$(BIN)/python -m compileall -q $(LINT_PACKAGES)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

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
