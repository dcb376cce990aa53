"""Webhook failures are visible: every refused (4xx) and failed (5xx) webhook request is
counted by reason in `verity_webhook_failures_total`, which /metrics exports and the
VerityWebhookServerErrors / VerityWebhookRefusals alerts read."""

import json
import time

import pytest
from django.db import connection
from django.test import Client
from prometheus_client import REGISTRY

from recovery.models import OutboxMessage
from webhooks.models import ProviderEvent

from .events import SECRET, event_for, intent_object, post, sign


def failures(reason: str) -> float:
    return REGISTRY.get_sample_value("verity_webhook_failures_total", {"reason": reason}) or 0.0


def an_event():
    return event_for(
        intent_object(
            pi_id="pi_failures",
            status="succeeded",
            amount=900,
            metadata={"purchase_id": "pur_f", "operation_id": "op_f"},
        ),
        "payment_intent.succeeded",
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("forged", "bad_signature"),
        ("missing", "bad_signature"),
        ("stale", "stale"),
        ("not_an_event", "malformed"),
    ],
)
def test_each_refusal_is_counted_by_reason_and_stores_nothing(client, case, reason):
    event = an_event()
    body = b'{"hello": "world"}' if case == "not_an_event" else json.dumps(event).encode()
    header = {
        "forged": f"t={int(time.time())},v1={'0' * 64}",
        "missing": "",
        "stale": sign(body, SECRET, ts=int(time.time()) - 301),
        "not_an_event": sign(body),
    }[case]
    before = {r: failures(r) for r in ("bad_signature", "stale", "malformed", "server_error")}

    response = post(client, body, header=header)

    assert response.status_code == 400
    after = {r: failures(r) for r in before}
    assert after == {**before, reason: before[reason] + 1}
    assert ProviderEvent.objects.filter(event_id=event["id"]).count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_delivery_verity_fails_to_store_is_a_500_and_counted_as_server_error():
    # given: the database refuses writes to the event table (a real fault at PostgreSQL,
    # not a patched function): a trigger raises on every insert
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE FUNCTION verity_test_refuse() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'drill: event table refuses writes'; END $$;
            CREATE TRIGGER verity_test_refuse BEFORE INSERT ON webhooks_providerevent
            FOR EACH ROW EXECUTE FUNCTION verity_test_refuse();""")
    try:
        event = an_event()
        before = failures("server_error")

        # when: a correctly signed delivery arrives
        response = post(Client(raise_request_exception=False), event)

        # then: a 500 (the provider will retry), counted, and nothing half-written
        assert response.status_code == 500
        assert failures("server_error") == before + 1
        assert ProviderEvent.objects.filter(event_id=event["id"]).count() == 0
        assert OutboxMessage.objects.filter(dedupe_key=f"event:{event['id']}").count() == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER verity_test_refuse ON webhooks_providerevent;"
                "DROP FUNCTION verity_test_refuse();"
            )


@pytest.mark.django_db
def test_the_failure_counter_is_exported_for_every_reason_from_the_start(client):
    text = client.get("/metrics").content.decode()

    for reason in ("bad_signature", "stale", "malformed", "server_error"):
        assert f'verity_webhook_failures_total{{reason="{reason}"}}' in text
