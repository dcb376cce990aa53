"""Fixtures for the console and the customer page.

Preconditions that no public service can produce quickly (a quarantined event, a stuck
outbox row, a step that failed) are built with factories and direct model setup; every
action under test goes through Verity's services or HTTP views.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from support.access import Role, ensure_groups


@pytest.fixture
def roles(db):
    ensure_groups()


def _user(username: str, *role_names: str) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username)
    for name in role_names:
        user.groups.add(Group.objects.get(name=name))
    return user


@pytest.fixture
def users(roles) -> dict[str, User]:
    return {
        "nobody": _user("nobody"),
        "support": _user("sam", Role.SUPPORT),
        "operator": _user("olga", Role.OPERATOR),
        "operator2": _user("omar", Role.OPERATOR),
        "finance": _user("fred", Role.FINANCE),
        "finance2": _user("fiona", Role.FINANCE),
    }


@pytest.fixture
def login(client, users):
    """login("operator") -> the test client signed in as that role's user."""

    def as_role(role: str | None):
        client.logout()
        if role is not None:
            client.force_login(users[role])
        return client

    return as_role


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
