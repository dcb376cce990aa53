"""The customer page is written for a person on a phone: how they bought (not the API's
name), the date, USDC named when they paid with it, how much is coming back on a refund,
one sentence that the page updates itself, and a "Pay again" that lands on a page in the
same style."""

from __future__ import annotations

import pytest

from payments.enums import PurchaseStatus, Rail
from payments.models import PurchaseChannel
from tests.support.builders import FAILED, SUCCEEDED, UNKNOWN, purchase_in
from tests.support.test_status_page import REFUND_CONFIRMED

pytestmark = pytest.mark.django_db(transaction=True)

ENGINEER_WORDS = ("REST API", "MCP", "Agentic Commerce Protocol", "eip155", "x402")


def _open(phone, live_server, purchase) -> str:
    phone.open(f"{live_server.url}/status/{purchase.status_token}/")
    return phone.text()


def test_the_page_says_how_and_when_in_a_persons_words(phone, live_server):
    for channel, words in (
        (PurchaseChannel.API, "The shop's website or app"),
        (PurchaseChannel.MCP, "An AI assistant, on your behalf"),
        (PurchaseChannel.ACP, "An AI assistant, on your behalf"),
    ):
        purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN], channel=channel)
        text = _open(phone, live_server, purchase)
        assert not [w for w in ENGINEER_WORDS if w in text], text
        assert words in text, text
        assert purchase.created_at.strftime("%-d %B %Y") in text, text
        assert text.count("by itself") == 1, text
    phone.screenshot("customer-phone-7-checking-words.png")


def test_a_usdc_payment_is_named_in_usdc(phone, live_server):
    purchase = purchase_in(
        PurchaseStatus.PAID, ops=[{**SUCCEEDED, "rail": Rail.X402, "provider_reference": "0xabc"}]
    )
    text = _open(phone, live_server, purchase)
    assert "15.00 USDC" in text and "wallet" in text, text
    assert not [w for w in ENGINEER_WORDS if w in text], text
    phone.screenshot("customer-phone-8-paid-in-usdc.png")


def test_a_refund_says_how_much_is_coming_back(phone, live_server):
    purchase = purchase_in(
        PurchaseStatus.REFUNDED, ops=[SUCCEEDED, REFUND_CONFIRMED], order="ORD-9"
    )
    text = _open(phone, live_server, purchase)
    assert "Coming back to you: 15.00 USD" in text, text
    phone.screenshot("customer-phone-9-refunded.png")


def test_pay_again_lands_on_a_styled_page(phone, live_server, settings):
    settings.STOREFRONT_CHECKOUT_URL = f"{live_server.url}/demo-checkout/{{purchase_id}}"
    purchase = purchase_in(PurchaseStatus.PAYMENT_FAILED, ops=[FAILED])
    _open(phone, live_server, purchase)
    phone.tap("#pay-again")
    assert phone.js("location.pathname") == f"/demo-checkout/{purchase.pk}"
    # the status pages' stylesheet applies (a bare stub has none)
    assert phone.js("document.styleSheets.length") >= 1
    assert phone.js("getComputedStyle(document.querySelector('main')).maxWidth") != "none"
    assert "card" in phone.text() and purchase.pk in phone.text()
    phone.screenshot("customer-phone-10-store-checkout-after-decline.png")
