# Two commands: `make run` (embedded demo) and `make test` (real services, throwaway).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Runtime files of the embedded default (config/env.py reads the same variable).
VERITY_VAR_DIR ?= var
export VERITY_VAR_DIR

.PHONY: run serve test test-fast lint fmt typecheck deps lock soak bench drill drill-x402 fuzz audit clean

# The x402 rail's local chain (anvil + Circle's USDC build artifacts, npm packages pinned in
# tools/chain/package-lock.json). Installed when node/npm are present; tests.stack --x402
# starts it with the SDK's facilitator. Without Node the x402 tests are not run.
CHAIN_DIR := tools/chain
HAVE_NPM := $(shell command -v npm >/dev/null 2>&1 && echo yes)
X402_STACK := $(if $(HAVE_NPM),--x402,)

# Development installs both locks' content: requirements-dev.lock is the production lock
# (requirements.lock, same pins) plus the `dev` extra. Hashes are checked (--require-hashes
# is implied by the hashed lock). The Dockerfile installs requirements.lock only.
$(VENV)/.installed: requirements.lock requirements-dev.lock
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 needed"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the Python dependencies into $(VENV)/ (hash-checked; about a minute the first time)..."
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.lock
	touch $@

$(CHAIN_DIR)/node_modules/.installed: $(CHAIN_DIR)/package.json $(CHAIN_DIR)/package-lock.json
	@echo "Installing the local x402 chain's npm packages into $(CHAIN_DIR)/node_modules/..."
	npm ci --prefix $(CHAIN_DIR) --no-audit --no-fund --loglevel error
	touch $@

# The x402 project's own npm client (@x402/fetch), run unmodified against Verity in
# tests/x402/test_npm_client_buys.py; pinned by its package-lock.json.
X402_FETCH_DIR := tools/x402_fetch
$(X402_FETCH_DIR)/node_modules/.installed: $(X402_FETCH_DIR)/package.json $(X402_FETCH_DIR)/package-lock.json
	@echo "Installing the npm x402 client into $(X402_FETCH_DIR)/node_modules/..."
	npm ci --prefix $(X402_FETCH_DIR) --no-audit --no-fund --loglevel error
	touch $@

# The Python and npm installs run side by side on a fresh clone (a few seconds saved).
DEPS := $(VENV)/.installed $(if $(HAVE_NPM),$(CHAIN_DIR)/node_modules/.installed $(X402_FETCH_DIR)/node_modules/.installed,)
deps:
	@$(MAKE) --no-print-directory -s -j 3 $(DEPS)

# Regenerate both locks from pyproject.toml (after adding or bumping a dependency).
# The dev lock is solved first; the production lock is constrained to the same pins.
lock:
	test -x $(VENV)/bin/uv || $(PY) -m pip install -q uv
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 -o requirements-dev.lock -q
	$(VENV)/bin/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 -c requirements-dev.lock -o requirements.lock -q

# Development: DEBUG on (the example SECRET_KEY and the console e-mail backend are
# refused with DEBUG off, see docs/security.md). Each port can be moved for one run
# (`make run VERITY_PORT=8001`); the links and the webhook target follow it.
run serve: export DEBUG ?= true
run serve: export VERITY_PORT ?= 8000
run serve: export LOCALSTRIPE_PORT ?= 8420
run serve: export PUBLIC_BASE_URL ?= http://127.0.0.1:$(VERITY_PORT)
run serve: export STRIPE_API_BASE ?= http://127.0.0.1:$(LOCALSTRIPE_PORT)
run serve: export STOREFRONT_CHECKOUT_URL ?= http://127.0.0.1:$(VERITY_PORT)/demo-checkout/{purchase_id}

# Procfile.dev's processes without the x402 chain (started only when Node is there).
SERVE_PROCESSES := localstripe web worker beat banner
# What the reader's own shell needs to talk to this run (config/env.py reads the file).
DEV_ENV_VARIABLES := DEBUG VERITY_PORT LOCALSTRIPE_PORT PUBLIC_BASE_URL STRIPE_API_BASE \
	STOREFRONT_CHECKOUT_URL

# What `make run` starts, without the install step (one recipe: a Ctrl-C reaches one make,
# which then says nothing). The newcomer smoke test (tests/foundation/test_newcomer_smoke.py)
# boots exactly this, on free ports.
#  1. With Node and tools/chain installed (and X402_ENABLED not set by you), the x402 rail is
#     on: Procfile.dev's `chain` process starts anvil + the token + the facilitator on
#     X402_CHAIN_PORT / X402_FACILITATOR_PORT (8545 / 8402), and everything else gets its
#     fixed X402_* settings (tools/x402_chain.py --print-env). Without Node: as before.
#  2. Every port is checked before anything starts (tools/dev_ports.py): a taken one is
#     named with the variable that moves it, and nothing is left running.
#  3. $(VERITY_VAR_DIR)/.env: DEBUG and the URLs of this run, for commands typed in your
#     own shell (manage.py, the stdio MCP server); your environment still wins.
#  4. Ctrl-C stops every process (honcho) and ends the run quietly (exit 0, not "Error 130").
define SERVE_RECIPE
	@set -e; \
	if [ -z "$${X402_ENABLED:-}" ] && x402_env="$$($(PY) -m tools.x402_chain --print-env)"; \
	then eval "$$x402_env"; procs=""; \
	  chain_ports="chain=$${X402_CHAIN_PORT:-8545} facilitator=$${X402_FACILITATOR_PORT:-8402}"; \
	else x402_env=""; procs="$(SERVE_PROCESSES)"; chain_ports=""; fi; \
	$(PY) -m tools.dev_ports web=$$VERITY_PORT localstripe=$$LOCALSTRIPE_PORT $$chain_ports; \
	mkdir -p $(VERITY_VAR_DIR)/log $(VERITY_VAR_DIR)/run; \
	rm -f $(VERITY_VAR_DIR)/run/*.ready; \
	{ echo "# Written by make run for commands typed in your own shell (config/env.py);"; \
	  echo "# development only. A variable set in your environment wins over this file."; \
	  for name in $(DEV_ENV_VARIABLES); do echo "$$name=$${!name}"; done; \
	  [ -z "$$x402_env" ] || echo "$$x402_env" | sed 's/^export //'; \
	} > $(VERITY_VAR_DIR)/.env; \
	echo "Preparing the database and the demo data in $(VERITY_VAR_DIR)/..."; \
	$(PY) manage.py migrate --noinput -v 0; \
	$(PY) manage.py seed_demo; \
	$(PY) manage.py seed_console_demo; \
	rc=0; PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho -f Procfile.dev start $$procs \
	  || rc=$$?; \
	if [ $$rc -eq 130 ]; then echo "Stopped (Ctrl-C)."; exit 0; fi; exit $$rc
endef

run: deps
	$(SERVE_RECIPE)

serve:
	$(SERVE_RECIPE)

# pytest-xdist workers, each with its own stack (tests.stack starts one per worker; see
# docs/performance.md "Test suite time"). TEST_WORKERS=0 runs serially on one stack.
# One test handed out at a time, slowest first (tests/conftest.py SLOWEST_FIRST).
TEST_WORKERS ?= 3
# tests/replica runs on a stack with a streaming standby (tests.stack --replica), in its own
# short invocation (7 tests, docs/scaling.md); without the standby it is not collected.
# `make test REPLICA_TESTS=` skips it.
REPLICA_TESTS ?= tests/replica
# Tests that assert a wall-clock bound (`@pytest.mark.alone`, 5 tests, ~17 s) run by
# themselves after the parallel run: inside it, each one waited for every running test to
# end (the soak among them) while it held the other workers back, 1-2 idle minutes a run.
ALONE_TESTS ?= $(shell grep -rl --include='test_*.py' '@pytest.mark.alone' tests)
TEST_LOG := $(VERITY_VAR_DIR)/log
# mypy and the replica tests run beside the parallel run (the suite is bound by the
# machine's CPU, but its last minute leaves cores idle); their output is shown after it,
# and either failing fails `make test`. Then the `alone` tests, by themselves.
test: deps lint
	@set -u; mkdir -p $(TEST_LOG); \
	echo "mypy$(if $(REPLICA_TESTS), and $(REPLICA_TESTS),) run beside the parallel run (output after it)"; \
	DEBUG=true $(PY) -m mypy > $(TEST_LOG)/typecheck.txt 2>&1 & typecheck=$$!; \
	$(if $(REPLICA_TESTS),$(PY) -m tests.stack --replica -- $(PY) -m pytest -q -p no:cacheprovider \
	  $(REPLICA_TESTS) > $(TEST_LOG)/replica-tests.txt 2>&1 & replica=$$!;) \
	rc=0; $(PY) -m tests.stack $(X402_STACK) -- $(PY) -m pytest -n $(TEST_WORKERS) --dist load \
	  --maxschedchunk 1 --durations=25 -m "not alone" $(PYTEST_ARGS) || rc=$$?; \
	echo "== mypy"; wait $$typecheck || rc=1; cat $(TEST_LOG)/typecheck.txt; \
	$(if $(REPLICA_TESTS),echo "== $(REPLICA_TESTS)"; wait $$replica || rc=1; \
	  tail -n 40 $(TEST_LOG)/replica-tests.txt;) \
	[ $$rc -eq 0 ] || exit $$rc; \
	$(if $(ALONE_TESTS),echo "== the alone tests"; \
	  $(PY) -m tests.stack -- $(PY) -m pytest -q -p no:cacheprovider -m alone $(ALONE_TESTS))

# The inner loop: the linter, then the static checks and quick behaviour tests on one
# stack without the chain (no anvil start), in about a minute. `make test` runs all.
FAST_TESTS ?= tests/foundation/test_import_contracts.py tests/foundation/test_error_codes_named.py \
  tests/foundation/test_no_status_literals.py tests/foundation/test_readme_rules.py \
  tests/foundation/test_docs_links.py tests/foundation/test_vocabularies.py \
  tests/foundation/test_squashed_migrations.py tests/api/test_strict_money_requests.py \
  tests/api/test_hostile_input.py tests/api/test_idempotency_records.py \
  tests/payments/test_refundable_room.py tests/security/test_api_hygiene.py
test-fast: deps lint
	$(PY) -m tests.stack -- $(PY) -m pytest -q -p no:cacheprovider $(FAST_TESTS) $(PYTEST_ARGS)

# ruff lints and checks the format (`make fmt` applies both); run by `make test`.
lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy with the Django, DRF and pydantic plugins (pyproject.toml [tool.mypy]); strict on
# the payments services and providers and on recovery. Run by `make test`.
typecheck: deps
	DEBUG=true $(PY) -m mypy

fmt: deps
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

soak: deps
	$(PY) bench/soak.py $(SOAK_ARGS)

bench: deps
	$(PY) bench/run_all.py

# Schemathesis and the whole-lifecycle state machine with larger budgets than CI's
# (VERITY_FUZZ_EXAMPLES per operation; VERITY_LIFECYCLE_EXAMPLES x VERITY_LIFECYCLE_STEPS).
fuzz: deps
	VERITY_FUZZ_EXAMPLES=$${VERITY_FUZZ_EXAMPLES:-100} VERITY_LIFECYCLE_EXAMPLES=$${VERITY_LIFECYCLE_EXAMPLES:-60} VERITY_LIFECYCLE_STEPS=$${VERITY_LIFECYCLE_STEPS:-30} $(PY) -m tests.stack $(X402_STACK) -- $(PY) -m pytest -q -p bench.fuzz_progress tests/api/test_schema_conformance.py tests/lifecycle/test_state_machine.py $(FUZZ_ARGS)

# Known-vulnerability audit of both locks. It needs the vulnerability database (PyPI's
# JSON API, or OSV with PIP_AUDIT_ARGS=--vulnerability-service=osv): run it on a machine
# that reaches it (a developer laptop, a CI job with network). --strict: where the
# database is unreachable every package is "not found" and the audit FAILS — without it
# pip-audit would skip them all and report "No known vulnerabilities found".
PIP_AUDIT_ARGS ?=
AUDIT := $(VENV)/bin/pip-audit --require-hashes --disable-pip --strict --progress-spinner off
audit: deps
	$(AUDIT) -r requirements.lock $(PIP_AUDIT_ARGS)
	$(AUDIT) -r requirements-dev.lock $(PIP_AUDIT_ARGS)

drill: export DEBUG ?= true
drill: deps
	$(PY) -m tools.drill

# Every x402 fault (pending, pending as 500, dropped, cancelled, blocklisted, expired,
# reorg, answer dropped) on a throwaway chain + facilitator; one table; non-zero on a
# broken rule (bench/x402_drill.py).
drill-x402: deps
	@test -n "$(HAVE_NPM)" || { echo "drill-x402 needs Node/npm (apt-get install nodejs npm)"; exit 2; }
	$(PY) -m tests.stack --x402 -- $(PY) -m bench.x402_drill

clean:
	rm -rf var $(VENV)
