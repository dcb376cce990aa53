"""Attack on recovery/0011 (ordered due index + autovacuum by dead rows): backwards and
forwards on the real PostgreSQL with unprocessed and processed rows present; the index is
the claim's order on unprocessed rows only, the reloptions follow, and the relay drains
everything afterwards (nothing lost across the rebuild)."""

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from recovery.models import OutboxCategory, OutboxMessage
from recovery.outbox import outbox_put
from recovery.relay import relay_drain

pytestmark = pytest.mark.django_db(transaction=True)


def _index_def() -> str:
    with connection.cursor() as c:
        c.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'outbox_due_idx'")
        row = c.fetchone()
    return row[0] if row else ""


def _reloptions():
    with connection.cursor() as c:
        c.execute("SELECT reloptions FROM pg_class WHERE relname = 'recovery_outboxmessage'")
        return c.fetchone()[0] or []


def test_0011_backwards_and_forwards_keeps_every_message(monkeypatch):
    monkeypatch.setattr("recovery.outbox._kick_relay", lambda *a, **k: None)
    with transaction.atomic():
        for i in range(20):
            outbox_put(category=OutboxCategory.NOOP, payload={}, dedupe_key=f"m:{i}")
    OutboxMessage.objects.filter(dedupe_key__in=["m:0", "m:1"]).update(
        processed_at=OutboxMessage.objects.first().created_at
    )
    assert "(available_at, id)" in _index_def() and "processed_at IS NULL" in _index_def()
    assert "autovacuum_vacuum_scale_factor=0" in _reloptions()
    try:
        call_command("migrate", "recovery", "0010", verbosity=0)
        assert "(available_at)" in _index_def() and "id)" not in _index_def()
        assert not any(o.startswith("autovacuum_vacuum") for o in _reloptions())
    finally:
        call_command("migrate", "recovery", verbosity=0)
    assert "(available_at, id)" in _index_def() and "processed_at IS NULL" in _index_def()
    assert "autovacuum_vacuum_threshold=10000" in _reloptions()
    relay_drain(batch=7)
    assert OutboxMessage.objects.count() == 20
    assert not OutboxMessage.objects.filter(processed_at__isnull=True).exists()
