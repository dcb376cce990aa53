"""Hostile input never gets a 5xx: a clear 4xx problem with nothing written, or
for a signed malformed event a 2xx with the event stored as `rejected` and counted."""

import pytest
from prometheus_client import REGISTRY

from payments.models import IdempotencyRecord, Purchase, Quote
from recovery.models import OutboxMessage
from tests.webhooks.events import SECRET, event_for, post

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = "[" * 3000 + "]" * 3000


@pytest.fixture(autouse=True)
def webhook_secret(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_WEBHOOK_TOLERANCE = 300
    settings.STRIPE_ACCOUNT = ""


def _counted(result: str) -> float:
    return REGISTRY.get_sample_value("verity_webhook_results_total", {"result": result}) or 0


def test_an_email_longer_than_the_column_is_a_400_and_writes_nothing(storefront, product):
    quote = storefront.quote(product.sku).json()
    email = "a" * 250 + "@example.com"
    r = storefront.purchase(quote, extra={"customer": {"reference": "c-long", "email": email}})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.content
    assert "email" in str(r.json()["errors"])
    assert Purchase.objects.count() == 0
    assert not IdempotencyRecord.objects.filter(route="purchases_create").exists()


@pytest.mark.parametrize(
    "path", ["purchases/pur_%00x", "operations/op_%00x", "purchases/pur_%00x/deliverable"]
)
def test_a_nul_byte_in_a_path_id_is_a_400(storefront, path):
    r = storefront.get(path)
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.content


def test_a_nul_byte_in_a_money_request_path_is_a_400_and_writes_nothing(storefront):
    r = storefront.post("purchases/pur_%00x/payments", {"payment_method": "pm_card_visa"})
    assert r.status_code == 400, r.content
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("body", [DEEP, '{"items":' + DEEP + ',"currency":"usd"}'])
def test_a_3000_deep_json_body_is_a_400_and_writes_nothing(storefront, body):
    r = storefront.http.post(
        "/api/v1/quotes", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="deep-1"
    )
    assert r.status_code == 400, r.content
    assert r["Content-Type"].startswith("application/problem+json")
    assert Quote.objects.count() == 0 and not IdempotencyRecord.objects.exists()


def test_a_signed_3000_deep_webhook_is_a_400_and_writes_nothing(client):
    from webhooks.models import ProviderEvent

    body = (
        '{"id":"evt_deep","type":"payment_intent.succeeded","data":{"object":{"a":' + DEEP + "}}}"
    ).encode()
    r = post(client, body)
    assert r.status_code == 400
    assert ProviderEvent.objects.count() == 0 and OutboxMessage.objects.count() == 0


@pytest.mark.parametrize(
    "shape", ["metadata_list", "metadata_string", "account_object", "account_number"]
)
def test_a_signed_malformed_event_is_stored_rejected_and_counted(client, shape):
    from webhooks.models import EventResult, ProviderEvent

    obj = {
        "id": "pi_hostile",
        "object": "payment_intent",
        "status": "succeeded",
        "amount": 1500,
        "currency": "usd",
        "metadata": {"purchase_id": "pur_x"},
    }
    account = None
    if shape == "metadata_list":
        obj["metadata"] = ["purchase_id", "pur_x"]
    elif shape == "metadata_string":
        obj["metadata"] = "purchase_id=pur_x"
    elif shape == "account_object":
        account = {"id": "acct_1"}
    else:
        account = 42
    event = event_for(obj, "payment_intent.succeeded")
    if account is not None:
        event["account"] = account
    before = _counted("rejected")
    r = post(client, event)
    assert r.status_code == 200, r.content
    stored = ProviderEvent.objects.get(event_id=event["id"])
    assert stored.result == EventResult.REJECTED
    assert stored.result_reason.startswith("malformed:")
    assert OutboxMessage.objects.count() == 0  # never processed
    assert _counted("rejected") == before + 1
    # a redelivery writes nothing more
    assert post(client, event).status_code == 200
    assert ProviderEvent.objects.count() == 1
