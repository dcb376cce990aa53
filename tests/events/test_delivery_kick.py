"""The delivery task's kick after each fan-out is coalesced as the relay's is
(recovery/kick.py): a burst of events in one window publishes two runs (one now, one at
the window's end), not one per event — one run sends everything due. Read where it lands:
the broker's queue and the deliveries a real worker sent."""

from __future__ import annotations

import json

import pytest

from config.redis_client import redis_client
from events.delivery import DELIVER_TASK
from events.models import DeliveryState, Event, WebhookDelivery
from events.services import endpoint_create
from recovery.kick import relay_kick_forget
from recovery.relay import relay_drain_once
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_kick_state():
    """No kick keys, queued tasks or remembered coverage before and after (a long window
    must not leave later tests' commits covered by a run an hour away)."""
    redis = redis_client()
    redis.flushdb()  # the test stack's one Redis: kick keys and broker queue alike
    relay_kick_forget()
    yield redis
    redis.flushdb()
    relay_kick_forget()


def _queued(redis) -> list[dict]:
    headers = [json.loads(m)["headers"] for m in redis.lrange("celery", 0, -1)]
    return [h for h in headers if h.get("task") == DELIVER_TASK]


def test_a_burst_of_events_publishes_two_delivery_runs(
    shop, product, receiver, loopback_allowed, settings, no_kick_state
):
    redis = no_kick_state
    settings.RELAY_KICK_WINDOW_MS = 3_600_000  # the whole burst in one window, however slow
    endpoint_create(api_client_id=shop.client.pk, url=receiver.url, actor="test")
    for _ in range(5):
        shop.new_purchase(product.sku)
    relay_drain_once()  # the fan-outs: one delivery per event, each with its kick
    made = WebhookDelivery.objects.count()
    assert made == Event.objects.count() >= 5
    kicks = _queued(redis)
    assert len(kicks) == 2  # was one per fan-out
    assert sorted(k.get("eta") is not None for k in kicks) == [False, True]


def test_every_event_of_a_burst_is_sent_by_a_worker_without_a_beat(
    shop, product, receiver, worker_env, settings, no_kick_state, celery_worker
):
    relay_kick_forget()  # the worker fixture emptied the broker
    settings.RELAY_KICK_WINDOW_MS = 200
    made = endpoint_create(api_client_id=shop.client.pk, url=receiver.url, actor="test")
    receiver.secrets = [made.secret]
    ids = [shop.new_purchase(product.sku)["id"] for _ in range(6)]

    def all_there() -> bool:
        stored = set(Event.objects.filter(purchase_id__in=ids).values_list("public_id", flat=True))
        return (
            stored
            and stored <= set(receiver.accepted)
            and not WebhookDelivery.objects.filter(state=DeliveryState.PENDING).exists()
        )

    # No beat runs here: an event whose kick was skipped for a run that never came would
    # stay undelivered.
    wait_for(all_there, timeout=60)
    assert receiver.rejected == 0 and receiver.duplicates == 0
