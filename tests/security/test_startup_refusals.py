"""Issue 15 ("also check") and 25 #8: settings that are unsafe in production stop the
process at start, naming what to set. Each case starts a real `manage.py check`."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STRONG_KEY = "x7!" + "k" * 30 + "9Qz$" + "p" * 20 + "R2&w"
SMTP = "django.core.mail.backends.smtp.EmailBackend"


def _check(**env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("DEBUG", "SECRET_KEY", "EMAIL_BACKEND", "STRIPE_API_KEY",
                         "STRIPE_API_BASE")}
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT,
                          env={**base, **env}, capture_output=True, text=True, timeout=120)


def test_default_secret_key_with_debug_off_refuses_to_start():
    result = _check(EMAIL_BACKEND=SMTP)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr
    assert _check(EMAIL_BACKEND=SMTP, DEBUG="true").returncode == 0


def test_live_key_over_plain_http_refuses_to_start():
    # given a live key and the default (localstripe, http) base
    result = _check(SECRET_KEY=STRONG_KEY, EMAIL_BACKEND=SMTP, STRIPE_API_KEY="sk_live_x")
    assert result.returncode != 0 and "STRIPE_API_BASE" in result.stderr
    # an https base, or none (api.stripe.com), is accepted
    for base in ("https://api.stripe.com", ""):
        ok = _check(SECRET_KEY=STRONG_KEY, EMAIL_BACKEND=SMTP, STRIPE_API_KEY="sk_live_x",
                    STRIPE_API_BASE=base)
        assert ok.returncode == 0, ok.stderr
    # a test key may talk to localstripe over loopback http
    assert _check(SECRET_KEY=STRONG_KEY, EMAIL_BACKEND=SMTP).returncode == 0


def test_console_email_backend_with_debug_off_refuses_to_start():
    result = _check(SECRET_KEY=STRONG_KEY)  # EMAIL_BACKEND unset: the console default
    assert result.returncode != 0 and "EMAIL_BACKEND" in result.stderr
    assert _check(SECRET_KEY=STRONG_KEY, DEBUG="true").returncode == 0
