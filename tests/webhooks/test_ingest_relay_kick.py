"""The relay kick after each stored delivery is coalesced (recovery/kick.py): at most two
publishes per window, and a process whose commits a published drain already covers asks
Redis nothing at all — while every stored delivery is still drained by a kick, with no beat
sweep behind it. Effects are read where they land: the broker's queue, Redis's own command
counters, the outbox rows a real worker processed."""

import json
import time

import pytest
from django.core.cache import cache

from config.redis_client import redis_client
from recovery.kick import relay_kick_forget
from recovery.models import OutboxMessage
from tests.waiting import wait_for
from webhooks.models import ProviderEvent

from .events import event_for, intent_object, post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_kick_state():
    """No kick keys, no queued kicks and no remembered coverage before and after: a long
    test window must not leave later tests' commits covered by a drain an hour away."""
    redis = redis_client()
    redis.flushdb()  # the test stack's one Redis: kick keys and broker queue alike
    relay_kick_forget()
    yield redis
    redis.flushdb()
    relay_kick_forget()


def _event(event_id: str) -> dict:
    return event_for(
        intent_object(
            pi_id=f"pi_{event_id}",
            status="succeeded",
            amount=1500,
            metadata={
                "purchase_id": "pur_kick",
                "operation_id": "op_k",
                "customer_reference": "c-1",
            },
        ),
        "payment_intent.succeeded",
        event_id=event_id,
    )


def _script_calls(redis) -> int:
    """Lua scripts Redis ran (a first EVALSHA the server did not know yet fails, NOSCRIPT,
    and is sent again with the script: not counted)."""
    stats = redis.info("commandstats")
    return sum(
        s.get("calls", 0) - s.get("failed_calls", 0) - s.get("rejected_calls", 0)
        for s in (stats.get("cmdstat_eval", {}), stats.get("cmdstat_evalsha", {}))
    )


def _queued_kicks(redis) -> list[dict]:
    """relay_drain messages waiting in the broker (countdown ones too: the Redis transport
    queues them at once and the worker holds them until their eta)."""
    headers = [json.loads(m)["headers"] for m in redis.lrange("celery", 0, -1)]
    return [h for h in headers if h.get("task") == "recovery.relay_drain"]


def test_a_burst_in_one_window_asks_redis_twice_and_publishes_twice(
    client, settings, no_kick_state
):
    redis = no_kick_state
    settings.RELAY_KICK_WINDOW_MS = 3_600_000  # the whole burst in one window, however slow
    before = _script_calls(redis)

    answers = [post(client, _event(f"evt_burst_{i:02d}")) for i in range(30)]

    assert {r.status_code for r in answers} == {200}
    assert ProviderEvent.objects.filter(event_id__startswith="evt_burst_").count() == 30
    assert OutboxMessage.objects.filter(dedupe_key__startswith="event:evt_burst_").count() == 30
    # The first delivery takes the leading key (a drain now), the second the trailing key (a
    # drain when the window ends); the other 28 are covered by that one and ask nothing.
    assert _script_calls(redis) - before == 2
    kicks = _queued_kicks(redis)
    assert len(kicks) == 2
    assert sorted(k.get("eta") is not None for k in kicks) == [False, True]


def test_a_drain_another_process_published_covers_this_process_too(client, settings, no_kick_state):
    redis = no_kick_state
    settings.RELAY_KICK_WINDOW_MS = 3_600_000
    # Another web process's commits took both keys (and published both drains) just now.
    cache.set("relay-kick:leading", 1, timeout=3600)
    cache.set("relay-kick:trailing", 1, timeout=3600)
    before = _script_calls(redis)

    answers = [post(client, _event(f"evt_other_{i:02d}")) for i in range(10)]

    assert {r.status_code for r in answers} == {200}
    assert OutboxMessage.objects.filter(dedupe_key__startswith="event:evt_other_").count() == 10
    assert _queued_kicks(redis) == []  # its trailing drain starts after all of these
    assert _script_calls(redis) - before == 1  # asked once, learnt how long it is covered


def test_every_delivery_of_a_steady_stream_is_drained_without_a_beat(
    client, settings, no_kick_state, celery_worker
):
    relay_kick_forget()  # the worker fixture emptied the broker
    # Short windows: the stream crosses many of them (leading, trailing and covered
    # deliveries, over and over) with few enough deliveries for a loaded worker.
    settings.RELAY_KICK_WINDOW_MS = 100
    deadline = time.monotonic() + 1.5
    ids = []
    while time.monotonic() < deadline and len(ids) < 150:
        ids.append(f"evt_stream_{len(ids):04d}")
        assert post(client, _event(ids[-1])).status_code == 200

    keys = [f"event:{event_id}" for event_id in ids]
    # No beat runs here: a delivery whose kick was skipped for a drain that never came would
    # stay unprocessed.
    wait_for(
        lambda: (
            not OutboxMessage.objects.filter(
                dedupe_key__in=keys, processed_at__isnull=True
            ).exists()
        ),
        timeout=90,
        interval=0.2,
    )
    assert OutboxMessage.objects.filter(dedupe_key__in=keys).count() == len(ids)
    assert ProviderEvent.objects.filter(event_id__in=ids).exclude(attempts=0).count() == len(ids)
