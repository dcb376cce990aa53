"""Ingestion's one statement runs as a named prepared statement on PostgreSQL (planned once
per connection), and on Django's unprepared cursor with DATABASE_PREPARED_STATEMENTS off
(PgBouncer < 1.21) — with the same rows written either way."""

import pytest
from django.db import connection

from recovery.models import OutboxCategory, OutboxMessage
from webhooks.models import EventResult, ProviderEvent

from .events import event_for, intent_object, post

pytestmark = pytest.mark.django_db(transaction=True)


def _event(event_id: str) -> dict:
    return event_for(
        intent_object(
            pi_id="pi_prepared",
            status="succeeded",
            amount=1500,
            metadata={
                "purchase_id": "pur_prep",
                "operation_id": "op_p",
                "customer_reference": "c-1",
            },
        ),
        "payment_intent.succeeded",
        event_id=event_id,
    )


def _prepared_ingest_statements() -> int:
    """Prepared statements of this connection (the test client's requests run on it) that
    insert provider events."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%INSERT INTO webhooks_providerevent%"],
        )
        return cursor.fetchone()[0]


def _stored_once(event_id: str) -> None:
    stored = ProviderEvent.objects.get(event_id=event_id)
    assert stored.result == EventResult.PENDING and stored.purchase_id == "pur_prep"
    message = OutboxMessage.objects.get(dedupe_key=f"event:{event_id}")
    assert message.category == OutboxCategory.PROCESS_EVENT
    assert message.payload == {"event": stored.pk} and message.processed_at is None


def test_deliveries_share_one_prepared_statement_and_a_redelivery_writes_nothing(client, settings):
    settings.DATABASE_PREPARED_STATEMENTS = True
    connection.close()  # a fresh connection: nothing prepared on it yet

    first = post(client, _event("evt_prepared_1"))
    second = post(client, _event("evt_prepared_2"))
    again = post(client, _event("evt_prepared_1"))

    assert [r.status_code for r in (first, second, again)] == [200, 200, 200]
    assert [r.json()["duplicate"] for r in (first, second, again)] == [False, False, True]
    _stored_once("evt_prepared_1")
    _stored_once("evt_prepared_2")
    assert ProviderEvent.objects.filter(event_id__startswith="evt_prepared_").count() == 2
    assert OutboxMessage.objects.filter(dedupe_key__startswith="event:evt_prepared_").count() == 2
    assert _prepared_ingest_statements() == 1  # prepared once, executed three times


def test_with_prepared_statements_off_a_delivery_prepares_nothing(client, settings):
    settings.DATABASE_PREPARED_STATEMENTS = False  # PgBouncer < 1.21 in transaction mode
    connection.close()

    first = post(client, _event("evt_unprepared_1"))
    again = post(client, _event("evt_unprepared_1"))

    assert (first.status_code, first.json()["duplicate"]) == (200, False)
    assert (again.status_code, again.json()["duplicate"]) == (200, True)
    _stored_once("evt_unprepared_1")
    assert OutboxMessage.objects.filter(dedupe_key="event:evt_unprepared_1").count() == 1
    assert _prepared_ingest_statements() == 0
