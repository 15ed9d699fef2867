# gradvault: the two commands are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: run test bench lint gpu-check clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[dev,torch,service,client,hf]'
	touch $(VENV)/.installed $@

run: $(VENV)/.installed
	$(PY) -m gradvault.core.demo

# pytest exits 5 when it collected no tests; that is a failure here, not a pass.
test: lint
	$(PY) -m pytest -q

bench: $(VENV)/.installed-test
	$(PY) -m bench

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

gpu-check: $(VENV)/.installed-test
	bash scripts/gpu-check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
