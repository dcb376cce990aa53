"""The API's customer_message, the console's customer view and the status page say the
same words: all come from support.customer_copy."""

from __future__ import annotations

from django.urls import reverse
from django.utils.html import escape

from payments.enums import PurchaseStatus
from support.customer_copy import customer_state
from tests.factories import make_client

from .builders import FAILED, SUCCEEDED, UNKNOWN, purchase_in


def test_api_console_and_page_agree(client, login, db):
    api_client, key = make_client(name="words")
    cases = [
        (PurchaseStatus.PAYMENT_UNKNOWN, [UNKNOWN]),
        (PurchaseStatus.PAID, [SUCCEEDED]),
        (PurchaseStatus.PAYMENT_FAILED, [FAILED]),
    ]
    for status, ops in cases:
        purchase = purchase_in(status, ops=ops, api_client=api_client)
        words = customer_state(purchase).message
        api = client.get(f"/api/v1/purchases/{purchase.pk}", HTTP_AUTHORIZATION=f"Api-Key {key}")
        assert api.status_code == 200
        assert api.json()["customer_message"] == words
        page = client.get(f"/status/{purchase.status_token}/").content.decode()
        assert escape(words) in page
        console = login("support").get(reverse("support:purchase", args=[purchase.pk]))
        assert escape(words) in console.content.decode()
        client.logout()
