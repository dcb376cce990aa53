"""A customer on a phone, on the status page of a purchase that makes the shop refuse them
another one: they can ask for a second purchase and get the code by e-mail.

The shop speaks REST to the live server, the customer taps in Chromium at 390×844."""

from __future__ import annotations

import re
import uuid

import pytest
import requests
from django.core import mail

from payments.enums import Outcome, PurchaseStatus, Stage
from payments.models import Purchase
from recovery.models import EmailMessage
from tests.factories import ProductFactory, make_client
from tests.outbox import settle_outbox
from tests.support.builders import UNKNOWN, purchase_in

pytestmark = pytest.mark.django_db(transaction=True)

CODE = re.compile(r"\b[A-Z0-9]{5}-[A-Z0-9]{5}\b")


class Shop:
    """The storefront's backend, calling Verity's REST API over HTTP."""

    def __init__(self, base: str, key: str) -> None:
        self.base = f"{base}/api/v1/"
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Api-Key {key}"

    def post(self, path: str, body: dict) -> requests.Response:
        return self.http.post(
            self.base + path, json=body, timeout=30, headers={"Idempotency-Key": str(uuid.uuid4())}
        )

    def buy(self, sku: str, customer: str, email: str, **extra) -> requests.Response:
        quote = self.post("quotes", {"items": [{"sku": sku, "quantity": 1}], "currency": "usd"})
        assert quote.status_code == 201, quote.text
        q = quote.json()
        return self.post(
            "purchases",
            {
                "quote_id": q["id"],
                "quote_version": q["version"],
                "customer": {"reference": customer, "email": email},
                **extra,
            },
        )


@pytest.fixture
def live_shop(live_server, settings):
    settings.PUBLIC_BASE_URL = live_server.url  # the status links the API hands out
    _, key = make_client(
        name="phone-shop", limit=100_000_000, scopes=("purchases:read", "purchases:write")
    )
    yield Shop(live_server.url, key)
    settle_outbox()


def _codes_emailed(purchase_id: str) -> list[str]:
    return [
        CODE.search(m.body).group(0)
        for m in mail.outbox
        if f"next to {purchase_id})" in m.subject and CODE.search(m.body)
    ]


def test_a_refused_buyer_taps_yes_on_their_phone_and_gets_the_code(phone, live_shop):
    product = ProductFactory(sku="PHONE-LAMP", price=2000, stock=100)
    first = live_shop.buy(product.sku, "cust-phone", "ana@example.com")
    assert first.status_code == 201, first.text
    first = first.json()
    refused = live_shop.buy(product.sku, "cust-phone", "ana@example.com")
    assert refused.status_code == 409 and refused.json()["code"] == "probable_duplicate_purchase"

    # The customer opens the earlier purchase's status link on their phone, and the
    # choice for a second, separate order.
    phone.open(first["status_url"])
    phone.tap("#new-purchase summary", navigates=False)
    assert phone.visible("#confirm-new-purchase"), phone.text()
    phone.screenshot("customer-phone-1-status-with-new-purchase.png")
    rows_before = EmailMessage.objects.filter(
        purchase_id=first["id"], kind__startswith="buyer_code:"
    ).count()

    phone.tap("#confirm-new-purchase")

    shown = phone.text()
    phone.screenshot("customer-phone-2-code-sent.png")
    assert phone.last_document_status() == 200, shown
    assert "open too long" not in shown and "You asked for a new purchase" in shown, shown
    assert phone.js("document.getElementById('new-purchase-answer').dataset.sent") == "sent"
    assert not CODE.search(shown)  # the code is only e-mailed, never on the page
    assert (
        EmailMessage.objects.filter(purchase_id=first["id"], kind__startswith="buyer_code:").count()
        == rows_before + 1
    )
    codes = _codes_emailed(first["id"])
    assert len(codes) == 1
    assert [m.to for m in mail.outbox if f"next to {first['id']})" in m.subject] == [
        ["ana@example.com"]
    ]

    # With the code, the shop's second purchase goes through.
    second = live_shop.buy(
        product.sku, "cust-phone", "ana@example.com", buyer_confirmation=codes[0]
    )
    assert second.status_code == 201, second.text
    assert Purchase.objects.filter(customer_reference="cust-phone").count() == 2


# What a person takes for "the button": filled with the page's accent colour.
FILLED = """[...document.querySelectorAll('button, a.button')].filter(e => {
  const r = e.getBoundingClientRect();
  return r.width > 0 && r.height > 0
      && getComputedStyle(e).backgroundColor === 'rgb(11, 92, 173)';
}).map(e => [e.id, e.innerText.trim(), e.getBoundingClientRect().bottom])"""


def test_a_buyer_told_not_to_pay_again_sees_the_safe_path_first(phone, live_server):
    purchase = purchase_in(
        PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN], customer_email="ben@example.com"
    )
    phone.open(f"{live_server.url}/status/{purchase.status_token}/")
    phone.screenshot("customer-phone-3-do-not-pay-again.png")
    assert "Please do not pay again" in phone.text()
    # One filled button, the safe one, on the first screen; the new purchase is folded away.
    (primary,) = phone.js(FILLED)
    assert primary[:2] == ["check-now", "Check again now"] and primary[2] <= 844, primary
    assert not phone.visible("#confirm-new-purchase")
    phone.tap("#new-purchase summary", navigates=False)
    assert phone.visible("#confirm-new-purchase")
    assert "You do not need this for the purchase above" in phone.text()
    assert [f[:2] for f in phone.js(FILLED)] == [primary[:2]]  # still outlined unfolded
    phone.screenshot("customer-phone-4-other-path-unfolded.png")
    # The safe path: the page again, nothing sent, nothing started.
    phone.tap("#check-now")
    assert phone.last_document_status() == 200
    assert EmailMessage.objects.filter(purchase_id=purchase.pk).count() == 0


def test_a_buyer_asked_for_3d_secure_can_finish_the_step(phone, live_server, settings):
    settings.STOREFRONT_CHECKOUT_URL = f"{live_server.url}/demo-checkout/{{purchase_id}}"
    purchase = purchase_in(
        PurchaseStatus.ACTION_REQUIRED,
        ops=[{"outcome": Outcome.AWAITING_BUYER, "stage": Stage.RECONCILING}],
        customer_email="cy@example.com",
    )
    phone.open(f"{live_server.url}/status/{purchase.status_token}/")
    phone.screenshot("customer-phone-5-needs-buyer-step.png")
    assert "one more step" in phone.text()
    (primary,) = phone.js(FILLED)
    assert primary[:2] == ["finish-step", "Finish the confirmation at the store"], primary
    assert primary[2] <= 844
    phone.tap("#finish-step")
    assert phone.last_document_status() == 200
    assert phone.js("location.pathname") == f"/demo-checkout/{purchase.pk}"
    phone.screenshot("customer-phone-6-store-checkout.png")
