# Two commands: `make run` (embedded demo) and `make test` (real services, throwaway).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test deps soak bench drill fuzz audit clean

$(VENV)/.installed: requirements.lock
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 needed"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	touch $@

deps: $(VENV)/.installed

run: deps
	mkdir -p var/broker/processed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py seed_console_demo
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho -f Procfile.dev start

test: deps
	$(PY) -m tests.stack -- $(PY) -m pytest $(PYTEST_ARGS)

soak: deps
	$(PY) bench/soak.py

bench: deps
	$(PY) bench/run_all.py

# Schemathesis and the whole-lifecycle state machine with larger budgets than CI's
# (VERITY_FUZZ_EXAMPLES per operation; VERITY_LIFECYCLE_EXAMPLES x VERITY_LIFECYCLE_STEPS).
fuzz: deps
	VERITY_FUZZ_EXAMPLES=$${VERITY_FUZZ_EXAMPLES:-100} VERITY_LIFECYCLE_EXAMPLES=$${VERITY_LIFECYCLE_EXAMPLES:-60} VERITY_LIFECYCLE_STEPS=$${VERITY_LIFECYCLE_STEPS:-30} $(PY) -m tests.stack -- $(PY) -m pytest -q tests/api/test_schema_conformance.py tests/lifecycle/test_state_machine.py

# Known-vulnerability audit of the locked dependencies (needs the PyPI JSON API).
audit: deps
	$(VENV)/bin/pip-audit -r requirements.lock --no-deps --disable-pip --progress-spinner off

drill: deps
	$(PY) manage.py drill

clean:
	rm -rf var $(VENV)
