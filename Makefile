# gradvault: the two commands are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: run test bench lint browser gpu-check clean

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
test: lint browser
	$(PY) -m pytest -q

# The browser tests (tests/ui) drive Debian's chromium at $(CHROMIUM); install it when it
# is missing and this is root (or sudo needs no password). Elsewhere the tests skip.
CHROMIUM := /usr/bin/chromium
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif ! command -v apt-get >/dev/null; then \
	  echo "no $(CHROMIUM) and no apt-get: the browser tests will be skipped"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y chromium \
	  || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	       chromium; }; \
	elif sudo -n true 2>/dev/null; then \
	  sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y \
	    chromium || { sudo -n apt-get update && sudo -n env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y chromium; }; \
	else \
	  echo "no $(CHROMIUM), and installing it needs root: the browser tests will be skipped"; \
	fi

bench: $(VENV)/.installed-test
	$(PY) -m bench

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

gpu-check: $(VENV)/.installed-test
	bash scripts/gpu-check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
