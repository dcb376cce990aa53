"""Attacks on the x402 proof, on the real chain (anvil + FiatTokenV2_2) through Verity.
Fixtures are the x402 suite's (the chain, a digital report, an agent API client)."""
from __future__ import annotations

import pytest

from tests.x402.conftest import agent, chain, report  # noqa: F401 - fixtures re-exported


@pytest.fixture
def people(django_user_model):
    return (django_user_model.objects.create(username="support-req"),
            django_user_model.objects.create(username="finance-ok"))
