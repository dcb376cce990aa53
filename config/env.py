"""The one place that reads the process environment (django-environ).

Every setting has a safe development default so `make run` works on a clean clone;
production overrides them through the environment only (never through files in git).
"""
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
