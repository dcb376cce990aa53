"""`manage.py check --deploy` passes with production settings from the environment."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRODUCTION_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "x7!" + "k" * 30 + "9Qz$" + "p" * 20 + "R2&w",
    "ALLOWED_HOSTS": "verity.example.com",
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_PRELOAD": "true",
    "TRUST_X_FORWARDED_PROTO": "true",
}


def test_check_deploy_passes_with_production_settings():
    env = {**os.environ, **PRODUCTION_ENV}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_debug_is_off_by_default():
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django,os;"
            "os.environ.setdefault('DJANGO_SETTINGS_MODULE','config.settings');"
            "django.setup();from django.conf import settings;print(settings.DEBUG)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "False"
