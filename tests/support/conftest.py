"""Fixtures for the console and the customer page (its people, `users` and `login`, are
shared: tests/fixtures.py).

Preconditions that no public service can produce quickly (a quarantined event, a stuck
outbox row, a step that failed) are built with factories and direct model setup; every
action under test goes through Verity's services or HTTP views.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def form_token(users):
    """form_token("support") -> a one-time form token as the console page mints it for
    that role's user (for a test that posts a form without rendering its page)."""
    from support.services import form_token_mint

    return lambda role: form_token_mint(users[role])


@pytest.fixture
def demo(users):
    """The console's demo purchases, as `make run` seeds them."""
    from io import StringIO

    from django.core.management import call_command

    from tests.factories import make_client

    make_client(name="demo-storefront")
    call_command("seed_console_demo", stdout=StringIO())
