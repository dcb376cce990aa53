"""The one place that reads the process environment (django-environ).

Every setting has a safe development default so `make run` works on a clean clone;
production overrides them through the environment only (never through files in git).
"""
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Every runtime file of the embedded default (SQLite database, filesystem broker, beat
# schedule, demo key, readiness markers) lives here; relative paths are to the checkout.
# The newcomer smoke test points it at a temporary folder to boot `make run` in isolation.
VAR_DIR = BASE_DIR / env("VERITY_VAR_DIR", default="var")
