"""Only the buyer lifts the duplicate guard, with the single-use code the earlier purchase's
status page e-mails: on the real stack, through the REST API and the status page as a
browser sends it (docs/design-notes.md, "One buyer, one charge")."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.test import Client

from payments.models import Purchase
from tests.factories import ProductFactory, make_client

from .client import Api

pytestmark = pytest.mark.django_db(transaction=True)

_CODE = re.compile(r"\b[A-Z0-9]{5}-[A-Z0-9]{5}\b")


def _buyer_code(purchase_id: str) -> str:
    """The buyer presses "Yes, start a new purchase" on the status page (a browser: the
    page's CSRF token and cookie) and reads the code in the e-mail it sends."""
    token = Purchase.objects.get(id=purchase_id).status_token
    browser = Client(enforce_csrf_checks=True)
    page = browser.get(f"/status/{token}/")
    csrf = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content)
    given = browser.post(
        f"/status/{token}/new-purchase",
        {"csrfmiddlewaretoken": csrf.group(1).decode() if csrf else ""},
    )
    assert given.status_code == 200, given.status_code
    about = [m for m in mail.outbox if f"next to {purchase_id})" in m.subject]
    return _CODE.search(about[-1].body).group(0)


def test_a_buyer_who_confirmed_once_can_confirm_a_third_purchase():
    """The buyer bought a basket, confirmed a second purchase of it with the e-mailed code,
    and now wants a third. The guard names one earlier purchase; the buyer confirms it with
    that purchase's code; if the guard then names the other one, a code for that one lifts
    it. Every purchase the guard names can be lifted by the buyer, so some sequence of
    codes opens the third purchase within the duplicate window (the lifecycle machine's
    rule `buyer_lifts_the_guard`)."""
    product = ProductFactory(sku="FBM-LOCK", price=2000, stock=100)
    client, key = make_client(
        name="shop-fbm", limit=100_000_000, scopes=("purchases:read", "purchases:write")
    )
    api = Api(key, client)
    first = api.purchase(api.quote(product.sku).json(), "cust-fbm")
    assert first.status_code == 201, first.content
    refused = api.purchase(api.quote(product.sku).json(), "cust-fbm")
    assert refused.json()["code"] == "probable_duplicate_purchase"
    second = api.purchase(
        api.quote(product.sku).json(),
        "cust-fbm",
        extra={"buyer_confirmation": _buyer_code(first.json()["id"])},
    )
    assert second.status_code == 201, second.content  # one lift works

    # the third: the buyer confirms whichever purchase the guard names, each in turn
    named, answer = [], None
    for _ in range(3):
        answer = api.purchase(
            api.quote(product.sku).json(),
            "cust-fbm",
            extra={"buyer_confirmation": _buyer_code(named[-1])} if named else {},
        )
        if answer.status_code == 201:
            break
        assert answer.json()["code"] == "probable_duplicate_purchase", answer.content
        named.append(answer.json()["purchase"])
    assert answer.status_code == 201, (
        f"the buyer confirmed {named} with e-mailed codes and is still refused: "
        f"{answer.json()['code']} naming {answer.json()['purchase']}"
    )
    assert Purchase.objects.filter(customer_reference="cust-fbm").count() == 3
