"""Fixtures for the console and the customer page.

Preconditions that no public service can produce quickly (a quarantined event, a stuck
outbox row, a step that failed) are built with factories and direct model setup; every
action under test goes through Verity's services or HTTP views.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from payments import services as pay
from support.access import Role, ensure_groups
from tests.factories import ProductFactory, make_client


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    # PBKDF2 at production cost makes every test user take ~0.3 s to create.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
def api_client(db):
    return make_client(limit=1_000_000)[0]


@pytest.fixture
def new_purchase(api_client):
    """A purchase through the real services (quote, purchase)."""
    counter = {"n": 0}

    def make(price=1500, quantity=1, customer=None, email="buyer@example.com"):
        counter["n"] += 1
        product = ProductFactory(price=price, name=f"Lamp {counter['n']}")
        quote = pay.quote_create(api_client=api_client,
                                 items=[{"sku": product.sku, "quantity": quantity}],
                                 currency="usd")
        return pay.purchase_create(
            api_client=api_client, quote_id=quote.id, quote_version=quote.version,
            customer_reference=customer or f"cust-{counter['n']}-{quote.id[-6:]}",
            customer_email=email)

    return make


@pytest.fixture
def pay_now(api_client):
    """Create and dispatch a payment for a purchase through the payments core."""

    def run(purchase, method="pm_card_visa"):
        op = pay.payment_create(purchase_id=purchase.pk, api_client=api_client,
                                payment_method=method)
        return pay.operation_dispatch(operation_id=op.pk)

    return run
