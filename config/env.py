"""The one place that reads the process environment (django-environ).

Every setting has a safe development default so `make run` works on a clean clone;
production overrides them through the environment only (never through files in git).
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Every runtime file of the embedded default (SQLite database, filesystem broker, beat
# schedule, demo key, readiness markers) lives here; relative paths are to the checkout.
# The newcomer smoke test points it at a temporary folder to boot `make run` in isolation.
VAR_DIR = BASE_DIR / env("VERITY_VAR_DIR", default="var")

# A development checkout's own shell: `make run` writes VAR_DIR/.env (DEBUG=true, the ports
# and URLs it chose, the local x402 chain's settings) so that a command pasted from the
# docs into the reader's shell (`manage.py demo_unknown_payment`, the stdio MCP server)
# runs with the settings of the `make run` it talks to. A variable set in the environment
# always wins. Never read in the production image (it has no tools/ folder) nor under the
# test stack (VERITY_STACK_DIR: it sets every variable itself).
DEV_ENV_FILE = VAR_DIR / ".env"
if (
    DEV_ENV_FILE.is_file()
    and (BASE_DIR / "tools").is_dir()
    and not os.environ.get("VERITY_STACK_DIR")
):
    environ.Env.read_env(DEV_ENV_FILE, overwrite=False)
