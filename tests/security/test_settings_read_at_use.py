"""Objects built from settings follow a change of those settings: get_provider is rebuilt on a
change of a setting it is built from, the x402 facilitator and chain reader compare every
setting they are built from, the runbook renders are forgotten on any settings change.
The original finding:
other objects built once from settings, which a test's override leaks into every later test
of its worker, or which ignore a later test's override. Each test plays the order out in
itself: step 1 is "an earlier test" (a settings override in effect while the object is built
or first used), step 2 is "a later test" (the settings of now) asserting what it must see.

Concrete orders, one process:
- runbooks: tests/security/test_console_disclosure.py::test_every_rendered_runbook_is_free_of_
  secrets renders every runbook (cached by (slug, mtime)); a later test that overrides
  X402_CONFIRMATIONS / RECONCILE_DEADLINE_SECONDS / SUPPORT_CONTACT reads the old values.
- get_provider: a test overriding FAULT_DRILLS_ENABLED=False (or FAULT_DRILL_RANDOM_RATE, or
  the Stripe timeouts) that is the first of its worker to build the provider; then every
  later test using the `drill` fixture gets DrillRefused.
- x402: get_facilitator() keeps X402_FACILITATOR_TIMEOUT, get_chain_reader() keeps
  X402_LOG_LOOKBACK_BLOCKS, from whichever test built them first."""

import pytest
from django.test import override_settings

from payments.providers import stripe as stripe_adapter
from payments.providers.x402 import chain as x402_chain
from payments.providers.x402 import facilitator as x402_facilitator
from support import runbooks

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _forget_what_these_tests_built():
    """These tests build the objects under overrides on purpose: none of it may outlive
    them (the very leak they show)."""
    yield
    runbooks._load.cache_clear()
    x402_facilitator._facilitator = None
    x402_chain._reader = None


@pytest.fixture
def fresh_provider():
    """As in a new worker: nothing built yet; rebuilt from the real settings after."""
    stripe_adapter.get_provider.cache_clear()
    yield
    stripe_adapter.get_provider.cache_clear()


def test_a_runbook_shows_the_settings_of_now_not_of_the_first_render(settings):
    # an earlier test renders the runbook (default X402_CONFIRMATIONS)
    first = runbooks.runbook_get("x402-settlement").html
    assert f"({settings.X402_CONFIRMATIONS})" in first or str(settings.X402_CONFIRMATIONS) in first

    # a later test runs with its own value
    settings.X402_CONFIRMATIONS = 987
    assert "987" in runbooks.runbook_get("x402-settlement").html


def test_an_override_rendered_into_a_runbook_does_not_outlive_its_test():
    runbooks._load.cache_clear()  # as in a new worker
    overridden = runbooks.duration_words(424242)  # "4 days 21 hours 50 min 42 s"
    with override_settings(RECONCILE_DEADLINE_SECONDS=424242):
        assert overridden in runbooks.runbook_get("unknown-operation").html
    assert overridden not in runbooks.runbook_get("unknown-operation").html


def test_fault_drills_follow_the_setting_of_now(fresh_provider):
    with override_settings(FAULT_DRILLS_ENABLED=False):
        with pytest.raises(stripe_adapter.DrillRefused):
            stripe_adapter.get_provider().arm_drill(
                key_prefix="r7_", step="confirm", mode="drop_response_after_send"
            )
    # a later test: drills are enabled (the default); the drill fixture arms one
    stripe_adapter.get_provider().arm_drill(
        key_prefix="r7_", step="confirm", mode="drop_response_after_send"
    )
    stripe_adapter.get_provider().drill_client.disarm_all()


def test_the_random_drill_rate_follows_the_setting_of_now(fresh_provider):
    with override_settings(FAULT_DRILL_RANDOM_RATE=1.0):
        stripe_adapter.get_provider()
    assert stripe_adapter.get_provider().drill_client._random_rate == 0.0


def test_the_stripe_read_timeout_follows_the_setting_of_now(fresh_provider, settings):
    with override_settings(STRIPE_READ_TIMEOUT=0.01):
        stripe_adapter.get_provider()
    timeout = stripe_adapter.get_provider().drill_client._inner._timeout
    assert timeout == (settings.STRIPE_CONNECT_TIMEOUT, settings.STRIPE_READ_TIMEOUT)


def test_the_facilitator_timeout_follows_the_setting_of_now(settings):
    with override_settings(X402_FACILITATOR_TIMEOUT=0.5):
        assert x402_facilitator.get_facilitator().timeout == 0.5
    assert x402_facilitator.get_facilitator().timeout == settings.X402_FACILITATOR_TIMEOUT


def test_the_chain_reader_lookback_follows_the_setting_of_now(settings):
    with override_settings(X402_LOG_LOOKBACK_BLOCKS=settings.X402_LOG_LOOKBACK_BLOCKS + 77):
        x402_chain.get_chain_reader()
    assert x402_chain.get_chain_reader().lookback == settings.X402_LOG_LOOKBACK_BLOCKS
