# Two commands: `make run` (embedded demo) and `make test` (real services, throwaway).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test deps soak bench drill clean

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
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho -f Procfile.dev start

test: deps
	$(PY) -m tests.stack -- $(PY) -m pytest $(PYTEST_ARGS)

soak: deps
	$(PY) bench/soak.py

bench: deps
	$(PY) bench/run_all.py

drill: deps
	$(PY) manage.py drill

clean:
	rm -rf var $(VENV)
