"""The webhook-endpoint writes are keyed like every other write: a retried create makes
one endpoint, a retried rotation rotates once (the secret a receiver still holds keeps
verifying), a write without a key or with a reused key makes nothing. Counted in the
endpoint rows and the key records, and checked with the stock `standardwebhooks` verifier."""

from __future__ import annotations

import pytest

from events.models import WebhookEndpoint
from payments.keyed import REPLAYED_HEADER
from payments.models import IdempotencyRecord
from tests.api.client import body_of, new_key
from tests.events.test_webhook_delivery import _pump, _quiet

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_retried_create_makes_one_endpoint_and_answers_its_secret(
    shop, receiver, loopback_allowed
):
    key, body = new_key(), {"url": receiver.url, "event_types": ["purchase.created"]}
    first = shop.post("webhook-endpoints", body, key=key)
    again = shop.post("webhook-endpoints", body, key=key)
    assert first.status_code == 201, first.content
    assert again.status_code == 200, again.content
    assert again.headers[REPLAYED_HEADER] == "true"
    assert body_of(again)["endpoint"]["id"] == body_of(first)["endpoint"]["id"]
    # The caller who lost the first answer still learns the secret that signs.
    assert body_of(again)["secret"] == body_of(first)["secret"]
    assert WebhookEndpoint.objects.filter(api_client_id=shop.client.pk).count() == 1
    assert IdempotencyRecord.objects.filter(route="webhook_endpoints_create").count() == 1


def test_a_create_without_a_key_or_with_a_reused_one_makes_nothing(
    shop, receiver, loopback_allowed
):
    unkeyed = shop.post("webhook-endpoints", {"url": receiver.url}, key=None)
    assert unkeyed.status_code == 400
    assert body_of(unkeyed)["code"] == "idempotency_key_required"
    key = new_key()
    assert shop.post("webhook-endpoints", {"url": receiver.url}, key=key).status_code == 201
    reused = shop.post("webhook-endpoints", {"url": receiver.url + "/other"}, key=key)
    assert reused.status_code == 422 and body_of(reused)["code"] == "idempotency_key_reused"
    assert WebhookEndpoint.objects.filter(api_client_id=shop.client.pk).count() == 1


def test_a_refused_create_leaves_its_key_free(shop, settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = False
    key = new_key()
    refused = shop.post("webhook-endpoints", {"url": "http://127.0.0.1:9/hooks"}, key=key)
    assert refused.status_code == 400, refused.content
    assert WebhookEndpoint.objects.count() == 0
    assert not IdempotencyRecord.objects.filter(key=key).exists()


def test_a_retried_rotation_rotates_once(shop, product, receiver, loopback_allowed):
    made = body_of(shop.post("webhook-endpoints", {"url": receiver.url}))
    endpoint_id, original = made["endpoint"]["id"], made["secret"]
    key, path = new_key(), f"webhook-endpoints/{endpoint_id}/rotate-secret"
    first = shop.post(path, {"overlap_seconds": 3600}, key=key)
    again = shop.post(path, {"overlap_seconds": 3600}, key=key)
    assert first.status_code == 200 and again.status_code == 200, again.content
    assert again.headers[REPLAYED_HEADER] == "true"
    assert body_of(again)["secret"] == body_of(first)["secret"] != original

    # Rotated once: the original secret is still the overlapping one, so a receiver that
    # has not switched yet keeps verifying.
    stored = WebhookEndpoint.objects.get(pk=endpoint_id)
    assert stored.previous_secret_salt and stored.previous_secret_expires_at
    receiver.secrets = [original]
    shop.new_purchase(product.sku)
    _pump(lambda: len(receiver.accepted) >= 1 and _quiet())
    assert receiver.rejected == 0
