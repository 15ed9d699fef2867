# gradvault: the two commands are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: run test bench load lint gpu-check deploy-check clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[dev,torch,service,client]'
	touch $(VENV)/.installed $@

run: $(VENV)/.installed
	$(PY) -m gradvault.core.demo

# pytest exits 5 when it collected no tests; that is a failure here, not a pass.
test: lint
	$(PY) -m pytest -q

# every figure in one table; bench/results/latest.{json,md} and README.md's table
bench: $(VENV)/.installed-test
	$(PY) -m bench --readme

# 32 clients pushing and restoring 64 MiB snapshots for 2 minutes against one uvicorn
load: $(VENV)/.installed-test
	$(PY) -m bench.load

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# without an NVIDIA GPU the script says so and exits 0 before installing anything
gpu-check: $(VENV)/.installed-test
	bash scripts/gpu-check.sh

# the compose stack end to end (root, Docker; not part of make test): docs/DEPLOY.md
deploy-check: $(VENV)/.installed-test
	bash deploy/check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
