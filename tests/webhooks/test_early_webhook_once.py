"""Once-only. The same signed delivery
sent by many threads at once (each its own connection, real PostgreSQL), through the early
path, through the whole chain, and both mixed; and a signed delivery Verity cannot store (a
500 without any patching). Asserted on webhooks_providerevent, recovery_outboxmessage and
the verity_webhook_* counters, not on the answers alone."""

import functools
import json

import pytest
from django.db import connection
from django.test import Client
from prometheus_client import REGISTRY

from recovery.models import OutboxMessage
from tests.webhooks.events import event_for, intent_object, sign
from webhooks.models import ProviderEvent

pytestmark = pytest.mark.django_db(transaction=True)

EARLY = "config.early_webhook.EarlyWebhookMiddleware"
PATH = "/webhooks/stripe/"


def _body(event_id: str, **extra) -> bytes:
    event = event_for(
        intent_object(
            pi_id="pi_r7once",
            status="succeeded",
            amount=1500,
            metadata={"purchase_id": "pur_r7once"},
        ),
        "payment_intent.succeeded",
        event_id=event_id,
    )
    return json.dumps({**event, **extra}).encode()


def _sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _counts() -> dict:
    return {
        "received": _sample("verity_webhook_results_total", result="received"),
        "duplicate": _sample("verity_webhook_results_total", result="duplicate"),
        "server_error": _sample("verity_webhook_failures_total", reason="server_error"),
    }


def _clients(settings, n: int, early: bool) -> list[Client]:
    """n clients whose middleware chain is loaded now (ClientHandler loads it on the first
    request), with or without the early middleware."""
    shipped = list(settings.MIDDLEWARE)
    if not early:
        settings.MIDDLEWARE = [m for m in shipped if m != EARLY]
    clients = [Client(raise_request_exception=False) for _ in range(n)]
    for c in clients:
        c.get("/healthz")
    settings.MIDDLEWARE = shipped
    return clients


def _posts(clients, body: bytes) -> list:
    sig = sign(body)
    return [
        functools.partial(
            c.post, PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sig
        )
        for c in clients
    ]


@pytest.mark.parametrize("mix", ["early", "chain", "mixed"])
def test_concurrent_duplicate_deliveries_store_one_event_and_one_outbox_row(
    settings, mix, send_at_once
):
    clients = {
        "early": lambda: _clients(settings, 8, True),
        "chain": lambda: _clients(settings, 8, False),
        "mixed": lambda: _clients(settings, 4, True) + _clients(settings, 4, False),
    }[mix]()
    event_id = f"evt_r7once_{mix}"
    before = _counts()

    for _ in range(3):  # three rounds: the first races the insert, the others redeliver
        answers = send_at_once(_posts(clients, _body(event_id)))
        assert not [a for a in answers if isinstance(a, Exception)], answers
        assert [a.status_code for a in answers] == [200] * 8

    assert ProviderEvent.objects.filter(event_id=event_id).count() == 1
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event_id}").count() == 1
    after = _counts()
    assert after["received"] - before["received"] == 1
    assert after["duplicate"] - before["duplicate"] == 23
    assert after["server_error"] == before["server_error"]


@pytest.mark.parametrize("early", [True, False], ids=["early", "chain"])
def test_a_signed_event_with_an_impossible_created_is_stored_rejected_once(settings, early):
    """`created` out of datetime's range. It was a 500 on every delivery (the provider
    would retry it for days); it is now stored once as rejected
    (`malformed:created`), never processed, and a redelivery is a duplicate."""
    client = _clients(settings, 1, early)[0]
    event_id = f"evt_r7once_created_{early}"
    body = _body(event_id, created=10**12)
    before = _counts()

    answers = [
        client.post(
            PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body)
        )
        for _ in range(2)
    ]

    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json()["duplicate"] for a in answers] == [False, True]
    assert _counts()["server_error"] == before["server_error"]
    stored = ProviderEvent.objects.get(event_id=event_id)
    assert (stored.result, stored.result_reason, stored.created) == (
        "rejected",
        "malformed:created",
        None,
    )
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event_id}").count() == 0


@pytest.mark.parametrize("early", [True, False], ids=["early", "chain"])
def test_postgresql_unreachable_is_one_503_counted_once_and_nothing_stored(settings, early):
    """No patching: the connection is pointed at a port nothing listens on, so the view's
    INSERT meets a real OperationalError. The answer is the same 503 on both paths and the
    view ran once (one server_error); once the database is back the redelivery stores."""
    client = _clients(settings, 1, early)[0]
    event_id = f"evt_r7once_down_{early}"
    body = _body(event_id)
    before = _counts()
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = "1"
    try:
        answer = client.post(
            PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body)
        )
    finally:
        connection.close()
        connection.settings_dict["PORT"] = port
    after = _counts()

    assert answer.status_code == 503 and int(answer["Retry-After"]) > 0
    assert json.loads(answer.content)["code"] == "database_unavailable"
    assert after["server_error"] - before["server_error"] == 1
    assert after["received"] == before["received"]
    assert ProviderEvent.objects.filter(event_id=event_id).count() == 0

    again = client.post(
        PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body)
    )
    assert again.status_code == 200 and json.loads(again.content)["duplicate"] is False
    assert ProviderEvent.objects.filter(event_id=event_id).count() == 1
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event_id}").count() == 1


def test_postgresql_unreachable_answers_the_same_bytes_on_both_paths(settings):
    answers = []
    for early in (True, False):
        client = _clients(settings, 1, early)[0]
        body = _body(f"evt_r7once_down_bytes_{early}")
        port = connection.settings_dict["PORT"]
        connection.close()
        connection.settings_dict["PORT"] = "1"
        try:
            answers.append(
                client.post(
                    PATH,
                    data=body,
                    content_type="application/json",
                    HTTP_STRIPE_SIGNATURE=sign(body),
                )
            )
        finally:
            connection.close()
            connection.settings_dict["PORT"] = port
    e, c = answers
    assert (e.status_code, dict(e.items()), e.content) == (
        c.status_code,
        dict(c.items()),
        c.content,
    )


@pytest.mark.parametrize("early", [True, False], ids=["early", "chain"])
def test_the_relay_kick_failing_on_redis_still_stores_once_and_answers_200(settings, early):
    """The kick's coalescing keys live in Redis: the cache pointed at a port nothing listens
    on makes the kick's Redis call fail after the commit. The delivery is still one 200, one
    event, one outbox row, no failure counted; its redelivery a duplicate."""
    from recovery.kick import relay_kick_forget

    client = _clients(settings, 1, early)[0]
    event_id = f"evt_r7once_redis_{early}"
    body = _body(event_id)
    relay_kick_forget()
    settings.CACHES = {
        "default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}
    }
    before = _counts()
    answers = [
        client.post(
            PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body)
        )
        for _ in range(2)
    ]
    after = _counts()

    assert [(a.status_code, json.loads(a.content)["duplicate"]) for a in answers] == [
        (200, False),
        (200, True),
    ]
    assert ProviderEvent.objects.filter(event_id=event_id).count() == 1
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event_id}").count() == 1
    assert {k: after[k] - before[k] for k in after} == {
        "received": 1,
        "duplicate": 1,
        "server_error": 0,
    }
