"""Settings that are unsafe in production stop the
process at start, naming what to set.

The refusals are raised while the settings load (config/settings/security.py), before any
app is imported, so each case loads the settings in a fresh interpreter with the case's
environment — what every `manage.py` command, gunicorn and Celery worker does first. One
test starts a real `manage.py check` both ways, so the refusal is seen to stop a real start;
the others load only the settings (a fifth of a check's CPU, about 35 interpreters)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STRONG_KEY = "x7!" + "k" * 30 + "9Qz$" + "p" * 20 + "R2&w"
SMTP = "django.core.mail.backends.smtp.EmailBackend"


def _check(*, command: tuple[str, ...] = ("-c", "import config.settings"), **env):
    base = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "DEBUG",
            "SECRET_KEY",
            "EMAIL_BACKEND",
            "STRIPE_API_KEY",
            "STRIPE_API_BASE",
            "X402_LOCAL_CHAIN",
            "STRIPE_DEDUPES_KEYS",
            "STRIPE_IDEMPOTENCY_WINDOW_SECONDS",
            "STRIPE_RESEND_MARGIN_SECONDS",
        )
    }
    return subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


MANAGE_CHECK = ("manage.py", "check")


def test_default_secret_key_with_debug_off_refuses_to_start():
    # A real start: `manage.py check` stops, naming the setting, and starts once it is fine.
    result = _check(command=MANAGE_CHECK, EMAIL_BACKEND=SMTP)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr
    assert "Verity refuses to start" in result.stderr
    assert _check(command=MANAGE_CHECK, EMAIL_BACKEND=SMTP, DEBUG="true").returncode == 0
    # The settings load alone refuses the same way (what the other cases run).
    result = _check(EMAIL_BACKEND=SMTP)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr


def test_live_key_over_plain_http_refuses_to_start():
    # given a live key and the default (localstripe, http) base
    result = _check(SECRET_KEY=STRONG_KEY, EMAIL_BACKEND=SMTP, STRIPE_API_KEY="sk_live_x")
    assert result.returncode != 0 and "STRIPE_API_BASE" in result.stderr
    # an https base, or none (api.stripe.com), is accepted
    for base in ("https://api.stripe.com", ""):
        ok = _check(
            SECRET_KEY=STRONG_KEY,
            EMAIL_BACKEND=SMTP,
            STRIPE_API_KEY="sk_live_x",
            STRIPE_API_BASE=base,
        )
        assert ok.returncode == 0, ok.stderr
    # a test key may talk to localstripe over loopback http
    assert _check(SECRET_KEY=STRONG_KEY, EMAIL_BACKEND=SMTP).returncode == 0


def test_console_email_backend_with_debug_off_refuses_to_start():
    result = _check(SECRET_KEY=STRONG_KEY)  # EMAIL_BACKEND unset: the console default
    assert result.returncode != 0 and "EMAIL_BACKEND" in result.stderr
    assert _check(SECRET_KEY=STRONG_KEY, DEBUG="true").returncode == 0


# -- x402 ----------------------------------------------------------------
def test_the_security_constants_are_make_runs_throwaway_chain():
    from config.settings.security import (
        MAKE_RUN_X402_ADDRESSES,
        MAKE_RUN_X402_KEY_SHA256,
        key_digest,
    )
    from tools import x402_chain

    env = x402_chain.local_env(port=8545, facilitator_port=8402)
    pay_key, _pay_to = x402_chain.local_key("pay-to")
    refund_key, refund_account = x402_chain.local_key("refund")
    assert env["X402_REFUND_PRIVATE_KEY"] == refund_key  # never pay_to's key
    assert {
        env["X402_PAY_TO"].lower(),
        env["X402_ASSET"].lower(),
        refund_account.lower(),
    } == MAKE_RUN_X402_ADDRESSES
    assert {key_digest(refund_key), key_digest(pay_key)} == MAKE_RUN_X402_KEY_SHA256


def test_a_refund_key_of_the_receiving_account_refuses_to_start():
    """Pay_to's key stays out of Verity on every network, the local one too:
    refunds come from a separate account with a float (not from what Verity received)."""
    from tools import x402_chain

    local = x402_chain.local_env(port=8545, facilitator_port=8402)
    pay_key, _pay_to = x402_chain.local_key("pay-to")
    result = _check(DEBUG="true", **{**local, "X402_REFUND_PRIVATE_KEY": pay_key})
    assert result.returncode != 0 and "X402_PAY_TO (the receiving account)" in result.stderr
    # any network's own pair: pay_to's key as the refund key is refused too
    own_key, own_pay_to = x402_chain.new_key()
    result = _check(
        DEBUG="true",
        X402_ENABLED="true",
        X402_NETWORK="eip155:8453",
        X402_FACILITATOR_URL="https://facilitator.example",
        X402_PAY_TO=own_pay_to,
        X402_ASSET="0x" + "34" * 20,
        X402_REFUND_PRIVATE_KEY=own_key,
    )
    assert result.returncode != 0 and "X402_PAY_TO (the receiving account)" in result.stderr
    other_key, _other = x402_chain.new_key()
    ok = _check(
        DEBUG="true",
        X402_ENABLED="true",
        X402_NETWORK="eip155:8453",
        X402_FACILITATOR_URL="https://facilitator.example",
        X402_PAY_TO=own_pay_to,
        X402_ASSET="0x" + "34" * 20,
        X402_REFUND_PRIVATE_KEY=other_key,
        X402_CONFIRMATIONS="10",
    )
    assert ok.returncode == 0, ok.stderr


def test_make_runs_x402_keys_on_another_network_refuse_to_start():
    from tools import x402_chain

    local = x402_chain.local_env(port=8545, facilitator_port=8402)
    real = {
        "X402_ENABLED": "true",
        "X402_NETWORK": "eip155:8453",
        "X402_FACILITATOR_URL": "https://facilitator.example",
        "X402_CONFIRMATIONS": "10",
    }
    for name in ("X402_PAY_TO", "X402_ASSET", "X402_REFUND_PRIVATE_KEY"):
        result = _check(DEBUG="true", **real, **{name: local[name]})
        assert result.returncode != 0 and "make run" in result.stderr, (name, result.stderr)
    # the same values on the local chain are `make run` itself
    assert _check(DEBUG="true", **{k: v for k, v in local.items()}).returncode == 0
    # this network's own values are accepted
    own = _check(DEBUG="true", **real, X402_PAY_TO="0x" + "12" * 20, X402_ASSET="0x" + "34" * 20)
    assert own.returncode == 0, own.stderr


def test_a_remote_facilitator_without_tls_refuses_to_start():
    result = _check(
        DEBUG="true", X402_ENABLED="true", X402_FACILITATOR_URL="http://facilitator.example"
    )
    assert result.returncode != 0 and "X402_FACILITATOR_URL" in result.stderr
    for url in ("https://facilitator.example", "http://127.0.0.1:8402"):
        assert _check(DEBUG="true", X402_ENABLED="true", X402_FACILITATOR_URL=url).returncode == 0


def test_a_facilitator_takes_one_credential_and_a_whole_api_key():
    secret = "a-facilitator-secret-that-must-not-be-echoed"
    key = {
        "X402_FACILITATOR_API_KEY_ID": "organizations/o/apiKeys/k",
        "X402_FACILITATOR_API_KEY_SECRET": secret,
    }
    both = _check(DEBUG="true", X402_FACILITATOR_AUTH_TOKEN=secret + "-token", **key)
    assert both.returncode != 0 and "both set" in both.stderr, both.stderr
    for half in ("X402_FACILITATOR_API_KEY_ID", "X402_FACILITATOR_API_KEY_SECRET"):
        result = _check(DEBUG="true", **{half: key[half]})
        assert result.returncode != 0 and "needs both" in result.stderr, result.stderr
        assert secret not in result.stderr
    assert secret not in both.stderr
    assert _check(DEBUG="true", **key).returncode == 0


def test_a_key_window_longer_than_stripe_keeps_keys_or_no_margin_refuses_to_start():
    """A one-call payment's lost answer is re-sent under its key inside the window: past
    what Stripe keeps (24 h), or with no margin, the re-send may pay a second time."""
    stripe = {
        "DEBUG": "true",
        "STRIPE_DEDUPES_KEYS": "true",
        "STRIPE_API_BASE": "https://api.stripe.com",
    }
    long = _check(**stripe, STRIPE_IDEMPOTENCY_WINDOW_SECONDS="86401")
    assert long.returncode != 0 and "STRIPE_IDEMPOTENCY_WINDOW_SECONDS" in long.stderr
    for margin in ("0", "-5"):
        none = _check(**stripe, STRIPE_RESEND_MARGIN_SECONDS=margin)
        assert none.returncode != 0 and "STRIPE_RESEND_MARGIN_SECONDS" in none.stderr
    # Stripe's own 24 h with the default margin, and a shorter window, start
    for window in ("86400", "3700"):
        ok = _check(**stripe, STRIPE_IDEMPOTENCY_WINDOW_SECONDS=window)
        assert ok.returncode == 0, ok.stderr
    # localstripe keeps keys as long as it is told: tests set short windows, no margin
    local = _check(
        DEBUG="true",
        STRIPE_DEDUPES_KEYS="true",
        STRIPE_API_BASE="http://127.0.0.1:8420",
        STRIPE_IDEMPOTENCY_WINDOW_SECONDS="999999",
        STRIPE_RESEND_MARGIN_SECONDS="0",
    )
    assert local.returncode == 0, local.stderr
    # a provider that does not dedupes keys never re-sends: the window is not read
    assert (
        _check(
            DEBUG="true", STRIPE_API_BASE="https://api.stripe.com", STRIPE_RESEND_MARGIN_SECONDS="0"
        ).returncode
        == 0
    )


def test_a_read_clock_margin_below_the_checks_floor_refuses_to_start():
    # Below 4 s the clock check's 2 s floor passes a skew the read's window cannot hold
    # (tests/payments/test_read_clock_over_a_slow_request.py): refused, in development too.
    refused = _check(DEBUG="true", PROVIDER_READ_CLOCK_MARGIN_SECONDS="3")
    assert refused.returncode != 0 and "PROVIDER_READ_CLOCK_MARGIN_SECONDS" in refused.stderr
    assert _check(DEBUG="true", PROVIDER_READ_CLOCK_MARGIN_SECONDS="4").returncode == 0
