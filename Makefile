# gradvault: the two commands are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
GV     := $(VENV)/bin/gradvault
# where `make run` and `make demo` serve (loopback only)
PORT   ?= 8000
STORE  ?= .gradvault/store

.PHONY: run demo test bench bench-readme load soak lint browser gpu-check deploy-check clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml setup.py core/store/_fused_stats.c | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[cli]'
	touch $@

$(VENV)/.installed-test: pyproject.toml setup.py core/store/_fused_stats.c | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[dev,torch,cli,hf,lightning]'
	touch $(VENV)/.installed $@

# The service on $(STORE) at 127.0.0.1:$(PORT), the demo against it, the URLs and the
# listing; the service then stays in the foreground until Ctrl-C.
run: $(VENV)/.installed
	$(GV) demo --service-store $(STORE) --port $(PORT) --keep-serving

# The same, and the service stops when the demo ends (for scripts).
demo: $(VENV)/.installed
	$(GV) demo --service-store $(STORE) --port $(PORT)

# pytest exits 5 when it collected no tests; that is a failure here, not a pass. The tests
# run in TEST_WORKERS processes (pytest-xdist): most of their time is spent waiting on
# servers and subprocesses, so 3 workers finish sooner than one even on 2 cores.
TEST_WORKERS ?= 3
test: lint browser
	GRADVAULT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The browser tests (tests/ui) drive Debian's chromium at $(CHROMIUM); install it when it
# is missing and this is root (or sudo needs no password), retrying while apt is busy.
# It never fails: where chromium cannot be had, one line says the browser tests will skip.
CHROMIUM ?= /usr/bin/chromium
browser:
	@CHROMIUM=$(CHROMIUM) bash scripts/browser.sh

# every figure in one table, written to bench/results/latest.{json,md}; README.md is left
# as it is (bench-readme puts the latest table into it)
bench: $(VENV)/.installed-test
	$(PY) -m bench

# README.md's benchmark table replaced by bench/results/latest.md (run `make bench` first)
bench-readme: $(VENV)/.installed-test
	$(PY) -m bench --readme-only

# 32 clients pushing and restoring 64 MiB snapshots for 2 minutes against one uvicorn
load: $(VENV)/.installed-test
	$(PY) -m bench.load

# one service under attack (slow headers, made-up methods, huge login bodies, 50 pushers)
# while a client pushes and restores, for SOAK_SECONDS; bench/results/soak.json
SOAK_SECONDS ?= 600
soak: $(VENV)/.installed
	$(PY) -m bench.soak --seconds $(SOAK_SECONDS)

# mypy checks the package as installed (src/gradvault, every part); its settings are in
# pyproject.toml, its cache in .mypy_cache
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy -p gradvault

# Without an NVIDIA GPU the script says so and exits 0 before installing anything; with
# one it installs the test environment (make's own target) and runs the GPU checks.
gpu-check:
	@MAKE="$(MAKE)" VENV=$(VENV) PY=$(PY) bash scripts/gpu-check.sh

# the compose stack end to end (root, Docker; not part of make test): docs/DEPLOY.md
deploy-check: $(VENV)/.installed-test
	bash deploy/check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
