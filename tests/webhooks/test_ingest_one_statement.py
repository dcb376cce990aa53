"""Ingestion on PostgreSQL outside a caller's transaction (a web request): the event and
its outbox row are ONE statement, with the same effects as the two-INSERT
transaction — counted in rows, not only in HTTP answers."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recovery.models import OutboxCategory, OutboxMessage
from webhooks.models import EventResult, ProviderEvent

from .events import event_for, intent_object, post, sign


def _event(event_id: str):
    return event_for(
        intent_object(
            pi_id="pi_one_stmt",
            status="succeeded",
            amount=1500,
            metadata={
                "purchase_id": "pur_one",
                "operation_id": "op_one",
                "customer_reference": "c-1",
            },
        ),
        "payment_intent.succeeded",
        event_id=event_id,
    )


@pytest.mark.django_db(transaction=True)
def test_a_new_event_is_one_statement_writing_the_event_and_its_outbox_row(client):
    event = _event("evt_one_statement_new")
    body = json.dumps(event).encode()

    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            "/webhooks/stripe/",
            data=body,
            content_type="application/json",
            HTTP_STRIPE_SIGNATURE=sign(body),
        )

    assert response.status_code == 200 and response.json()["duplicate"] is False
    sql = [q["sql"].lstrip() for q in queries.captured_queries]
    assert len(sql) == 1 and sql[0].upper().startswith("WITH"), sql
    stored = ProviderEvent.objects.get(event_id=event["id"])
    assert stored.result == EventResult.PENDING and stored.purchase_id == "pur_one"
    message = OutboxMessage.objects.get(dedupe_key=f"event:{event['id']}")
    assert message.category == OutboxCategory.PROCESS_EVENT
    assert message.payload == {"event": stored.pk}
    assert message.processed_at is None and message.attempts == 0


@pytest.mark.django_db(transaction=True)
def test_a_redelivery_through_the_one_statement_writes_nothing(client):
    event = _event("evt_one_statement_dup")
    assert post(client, event).json()["duplicate"] is False

    response = post(client, event)

    assert response.status_code == 200 and response.json()["duplicate"] is True
    assert ProviderEvent.objects.filter(event_id=event["id"]).count() == 1
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event['id']}").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_rejected_event_through_the_one_statement_gets_no_outbox_row(client):
    event = _event("evt_one_statement_rejected")
    event["data"]["object"]["metadata"] = "not an object"

    response = post(client, event)

    assert response.status_code == 200
    stored = ProviderEvent.objects.get(event_id=event["id"])
    assert stored.result == EventResult.REJECTED
    assert not OutboxMessage.objects.filter(dedupe_key=f"event:{event['id']}").exists()
