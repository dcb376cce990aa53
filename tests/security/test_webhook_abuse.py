"""Webhook abuse: forged, replayed (old timestamp), oversized, malformed bodies.
No state change and never a 5xx."""

import json
import time

import pytest

from recovery.models import OutboxMessage
from tests.webhooks.events import OLD_SECRET, SECRET, event_for, intent_object, sign
from webhooks.models import ProviderEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("webhook_secrets")]

URL = "/webhooks/stripe/"


def _send(client, body: bytes, signature: str | None):
    headers = {"HTTP_STRIPE_SIGNATURE": signature} if signature is not None else {}
    return client.post(URL, data=body, content_type="application/json", **headers)


def _event_bytes(**kw) -> bytes:
    obj = intent_object(pi_id="pi_abuse", status="succeeded", amount=1000)
    return json.dumps(event_for(obj, "payment_intent.succeeded", **kw)).encode()


CASES = {
    "forged signature": lambda b: (b, sign(b, "whsec_attacker")),
    "no signature": lambda b: (b, None),
    "garbage signature header": lambda b: (b, "t=abc,v1=zz"),
    "replayed (timestamp 1 hour old)": lambda b: (b, sign(b, SECRET, int(time.time()) - 3600)),
    "timestamp from the future": lambda b: (b, sign(b, SECRET, int(time.time()) + 3600)),
    "body altered after signing": lambda b: (b.replace(b"1000", b"9000"), sign(b)),
    "malformed JSON, validly signed": lambda b: (b"{not json", sign(b"{not json")),
    "JSON that is not an event": lambda b: (b'{"hello": 1}', sign(b'{"hello": 1}')),
    "event without id": lambda b: (
        (x := json.dumps({"type": "payment_intent.succeeded", "data": {"object": {}}}).encode()),
        sign(x),
    ),
    "oversized body": lambda b: ((x := b'{"pad": "' + b"a" * 400_000 + b'"}'), sign(x)),
    "empty body": lambda b: (b"", sign(b"")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_abusive_delivery_is_refused_and_changes_nothing(client, case):
    body, signature = CASES[case](_event_bytes())
    response = _send(client, body, signature)
    assert 400 <= response.status_code < 500, (case, response.status_code)
    assert ProviderEvent.objects.count() == 0
    assert OutboxMessage.objects.count() == 0


def test_old_secret_still_accepted_during_rotation(client):
    body = _event_bytes()
    assert _send(client, body, sign(body, OLD_SECRET)).status_code == 200
    assert ProviderEvent.objects.count() == 1


@pytest.mark.django_db
def test_oversized_api_body_is_refused_without_effect():
    from rest_framework.test import APIClient

    from payments.models import Quote
    from tests.factories import make_client

    _, key = make_client()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    body = '{"items": [], "currency": "usd", "pad": "' + "a" * 400_000 + '"}'
    response = api.post(
        "/api/v1/quotes", data=body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="big-1"
    )
    assert response.status_code == 413 and response.json()["code"] == "request_too_large"
    assert Quote.objects.count() == 0
    from payments.models import IdempotencyRecord

    assert IdempotencyRecord.objects.count() == 0  # the key is not bound
