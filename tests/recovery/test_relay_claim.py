"""The relay's one-statement claim and batched mark: same guarantees as before."""

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.models import OutboxCategory, OutboxMessage
from recovery.relay import relay_drain_once

pytestmark = pytest.mark.django_db(transaction=True)


def _noop(key, **fields):
    return OutboxMessage.objects.create(
        category=OutboxCategory.NOOP, payload={"k": key}, dedupe_key=key, **fields
    )


def test_a_claim_takes_the_oldest_due_messages_first():
    now = timezone.now()
    newest = _noop("newest", available_at=now - timedelta(seconds=1))
    _noop("oldest", available_at=now - timedelta(seconds=3))
    _noop("middle", available_at=now - timedelta(seconds=2))
    _noop("later", available_at=now + timedelta(seconds=60))  # not due

    assert relay_drain_once(batch=2) == 2

    processed = set(
        OutboxMessage.objects.filter(processed_at__isnull=False).values_list(
            "dedupe_key", flat=True
        )
    )
    assert processed == {"oldest", "middle"}
    newest.refresh_from_db()
    assert newest.processed_at is None and newest.attempts == 0 and newest.claimed_until is None


def test_a_failing_message_is_not_marked_with_the_rest_of_its_batch():
    before = timezone.now()
    for i in range(5):
        _noop(f"ok:{i}")
    # A RUN_STEPS message for a purchase that does not exist: its handler fails.
    failing = OutboxMessage.objects.create(
        category=OutboxCategory.RUN_STEPS,
        payload={"purchase": "pur_missing"},
        dedupe_key="steps:pur_missing",
    )

    assert relay_drain_once() == 6

    assert (
        OutboxMessage.objects.filter(
            dedupe_key__startswith="ok:", processed_at__isnull=False
        ).count()
        == 5
    )
    failing.refresh_from_db()
    assert failing.processed_at is None and failing.attempts == 1
    assert "DoesNotExist" in failing.last_error
    assert failing.claimed_until is None
    assert failing.available_at > before + timedelta(seconds=0.9)  # backed off


def test_without_prepared_statements_the_relay_drains_the_same(settings):
    # Behind PgBouncer < 1.21 in transaction mode: the same SQL on Django's own cursor.
    settings.DATABASE_PREPARED_STATEMENTS = False
    for i in range(30):
        _noop(f"np:{i}")

    assert relay_drain_once(batch=20) == 20
    assert relay_drain_once(batch=20) == 10

    assert not OutboxMessage.objects.filter(processed_at__isnull=True).exists()
    assert set(OutboxMessage.objects.values_list("attempts", flat=True)) == {1}


def test_the_claim_and_the_mark_are_prepared_statements_on_the_connection():
    # Django's connection has prepare_threshold None, under which psycopg ignores
    # execute(prepare=True): the relay's two statements were parsed and planned per batch.
    from django.db import connection

    for i in range(3):
        _noop(f"p:{i}")
    assert relay_drain_once(batch=2) == 2
    assert relay_drain_once(batch=2) == 1

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("SKIP LOCKED" in s for s in prepared), prepared  # the claim
    assert any("processed_at" in s and "ANY" in s for s in prepared), prepared  # the mark
    assert connection.connection.prepare_threshold is None  # Django's cursors: unchanged
