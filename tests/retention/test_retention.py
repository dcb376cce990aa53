"""Retention (docs/retention.md): old rows go in bounded batches, what is still needed stays.

Rows are backdated with a queryset update (time passing); purchases and operations are
made through the payments core. Every test counts rows before and after the run.
"""

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from config.celery import app
from payments import services as pay
from payments.enums import Outcome, PurchaseStatus
from payments.models import Dispute, IdempotencyRecord, PaymentOperation, Purchase
from recovery.models import OutboxCategory, OutboxMessage, RetentionArchive, RetentionState
from recovery.retention import RetentionCollector, policy_for, retention_prune_table, retention_run
from webhooks.models import EventResult, ProviderEvent

pytestmark = pytest.mark.django_db

OUTBOX = policy_for(OutboxMessage._meta.db_table)
EVENTS = policy_for(ProviderEvent._meta.db_table)
IDEMPOTENCY = policy_for(IdempotencyRecord._meta.db_table)


def _days_ago(days: float):
    return timezone.now() - timedelta(days=days)


def _outbox(n: int, *, age_days: float, processed: bool, tag: str) -> list[int]:
    OutboxMessage.objects.bulk_create(
        [
            OutboxMessage(category=OutboxCategory.NOOP, payload={}, dedupe_key=f"{tag}:{i}")
            for i in range(n)
        ]
    )
    rows = OutboxMessage.objects.filter(dedupe_key__startswith=f"{tag}:")
    at = _days_ago(age_days)
    rows.update(created_at=at, available_at=at, processed_at=at if processed else None)
    return list(rows.values_list("id", flat=True))


def _event(
    tag: str,
    *,
    age_days: float,
    result=EventResult.APPLIED,
    purchase_id="",
    operation_id="",
    object_id="",
) -> ProviderEvent:
    event = ProviderEvent.objects.create(
        event_id=f"evt_{tag}",
        type="payment_intent.succeeded",
        payload={"id": f"evt_{tag}"},
        result=result,
        purchase_id=purchase_id,
        operation_id=operation_id,
        object_id=object_id or f"pi_{tag}",
    )
    ProviderEvent.objects.filter(pk=event.pk).update(received_at=_days_ago(age_days))
    return event


def _close(purchase: Purchase, op: PaymentOperation | None = None) -> None:
    # State set directly: what closed the purchase is not under test here.
    if op is not None:
        PaymentOperation.objects.filter(pk=op.pk).update(outcome=Outcome.FAILED)
    Purchase.objects.filter(pk=purchase.pk).update(status=PurchaseStatus.PAYMENT_FAILED)


def test_processed_outbox_rows_past_retention_go_and_the_rest_stays():
    old = _outbox(30, age_days=settings.RETENTION_OUTBOX_DAYS + 1, processed=True, tag="old")
    recent = _outbox(5, age_days=1, processed=True, tag="recent")
    stuck = _outbox(3, age_days=settings.RETENTION_OUTBOX_DAYS + 2, processed=False, tag="stuck")
    assert OutboxMessage.objects.count() == 38

    result = retention_prune_table(policy=OUTBOX, batch_size=7)

    assert result.pruned == 30 and result.due == 0 and result.kept == 3
    assert not OutboxMessage.objects.filter(id__in=old).exists()
    assert set(OutboxMessage.objects.values_list("id", flat=True)) == set(recent + stuck)
    state = RetentionState.objects.get(table=OUTBOX.table)
    assert (state.pruned_total, state.due, state.kept) == (30, 0, 3)
    # Unprocessed work is never pruned, however old: the floor stays below it.
    assert state.floor_id < min(stuck)


def test_a_run_respects_its_batch_bound_and_the_backlog_is_due():
    _outbox(25, age_days=settings.RETENTION_OUTBOX_DAYS + 1, processed=True, tag="b")

    deleted = []

    def count_deletes(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("DELETE"):
            deleted.append(context["cursor"].rowcount)
        return result

    with connection.execute_wrapper(count_deletes):
        first = retention_prune_table(policy=OUTBOX, batch_size=10, max_batches=2)

    # Two statements (one per batch, each its own transaction), at most 10 rows each.
    assert deleted == [10, 10]
    assert (first.pruned, first.due, first.batches) == (20, 5, 2)
    assert OutboxMessage.objects.count() == 5
    assert RetentionState.objects.get(table=OUTBOX.table).due == 5

    second = retention_prune_table(policy=OUTBOX, batch_size=10, max_batches=2)

    assert (second.pruned, second.due) == (5, 0)
    assert OutboxMessage.objects.count() == 0
    assert RetentionState.objects.get(table=OUTBOX.table).pruned_total == 25


def test_rows_due_behind_more_held_rows_than_a_run_can_walk_are_reached():
    # given more held rows (old unprocessed work) than one run's budget (2 pages of 5),
    # ahead of rows due for pruning: the shape of refund keys kept until their purchase is
    # fully refunded, in front of a year of prunable keys
    old = settings.RETENTION_OUTBOX_DAYS + 1
    held = _outbox(23, age_days=old + 1, processed=False, tag="held")
    due = _outbox(10, age_days=old, processed=True, tag="due")
    assert max(held) < min(due)

    # when retention runs a few times with that budget
    runs = [retention_prune_table(policy=OUTBOX, batch_size=5, max_batches=2) for _ in range(4)]

    # then each run resumed where the last stopped (23 held rows walked once: 3 runs),
    # the due rows were reached and pruned, and every held row is still there
    assert [r.pruned for r in runs] == [0, 0, 7, 3]
    assert not OutboxMessage.objects.filter(id__in=due).exists()
    assert set(OutboxMessage.objects.values_list("id", flat=True)) == set(held)
    assert (runs[3].due, runs[3].kept) == (0, 23)
    state = RetentionState.objects.get(table=OUTBOX.table)
    assert state.floor_id == min(held) - 1 and state.cursor_id == state.floor_id

    # and once a held row is done with, the next sweep looks at it again and prunes it
    OutboxMessage.objects.filter(pk=held[-1]).update(processed_at=_days_ago(old))
    later = [retention_prune_table(policy=OUTBOX, batch_size=5, max_batches=2) for _ in range(3)]
    assert sum(r.pruned for r in later) == 1 and OutboxMessage.objects.count() == 22


def test_a_run_mid_sweep_reports_what_is_ahead_as_due():
    # given 30 rows due, a run's budget of 10
    _outbox(30, age_days=settings.RETENTION_OUTBOX_DAYS + 1, processed=True, tag="mid")

    # when runs are made one by one; then the backlog shrinks by a budget each time
    assert [
        retention_prune_table(policy=OUTBOX, batch_size=5, max_batches=2).due for _ in range(3)
    ] == [20, 10, 0]
    assert OutboxMessage.objects.count() == 0


def test_events_are_archived_never_dropped_and_open_purchases_keep_theirs(new_purchase, api_client):
    old = settings.RETENTION_WEBHOOK_EVENT_DAYS + 1
    closed = new_purchase()
    _close(closed)
    unknown = new_purchase()
    Purchase.objects.filter(pk=unknown.pk).update(status=PurchaseStatus.PAYMENT_UNKNOWN)
    with_open_op = new_purchase()
    op = pay.payment_create(
        purchase_id=with_open_op.pk, api_client=api_client, payment_method="pm_card_visa"
    )  # pending: an open operation
    disputed = new_purchase()
    paid = pay.payment_create(
        purchase_id=disputed.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    PaymentOperation.objects.filter(pk=paid.pk).update(outcome=Outcome.SUCCEEDED)
    Purchase.objects.filter(pk=disputed.pk).update(status=PurchaseStatus.COMPLETED)
    Dispute.objects.create(
        id="dp_open",
        purchase=disputed,
        payment=paid,
        amount=1500,
        currency="usd",
        status="needs_response",
    )

    gone = _event("closed", age_days=old, purchase_id=closed.pk)
    kept = [
        _event("unknown", age_days=old, purchase_id=unknown.pk),
        _event("openop", age_days=old, operation_id=op.pk),
        _event("dispute", age_days=old, object_id="dp_open"),
        _event("disputed", age_days=old, purchase_id=disputed.pk),
        _event("quarantined", age_days=old, result=EventResult.QUARANTINED),
        _event("held", age_days=old, result=EventResult.HELD, purchase_id=closed.pk),
        _event("recent", age_days=1, purchase_id=closed.pk),
    ]
    assert ProviderEvent.objects.count() == 8

    result = retention_prune_table(policy=EVENTS, batch_size=3)

    assert (result.pruned, result.due, result.kept) == (1, 0, 6)
    assert set(ProviderEvent.objects.values_list("pk", flat=True)) == {e.pk for e in kept}
    archived = RetentionArchive.objects.get(source=EVENTS.table)
    assert archived.row_id == gone.pk and archived.row["event_id"] == "evt_closed"
    assert archived.row["purchase_id"] == closed.pk and archived.row["result"] == "applied"

    # The unknown purchase settles (failed): its event is looked at again and archived.
    _close(unknown)
    again = retention_prune_table(policy=EVENTS, batch_size=3)

    assert again.pruned == 1 and ProviderEvent.objects.count() == 6
    assert not ProviderEvent.objects.filter(event_id="evt_unknown").exists()
    assert RetentionArchive.objects.filter(source=EVENTS.table).count() == 2


def _record(client, key: str, *, state="done", resource_type="", resource_id="", age_days):
    record = IdempotencyRecord.objects.create(
        api_client=client,
        route="purchases_create",
        key=key,
        fingerprint="f",
        state=state,
        lease_until=timezone.now(),
        resource_type=resource_type,
        resource_id=resource_id,
    )
    IdempotencyRecord.objects.filter(pk=record.pk).update(created_at=_days_ago(age_days))
    return record


def test_a_key_whose_purchase_is_still_open_is_kept(new_purchase, api_client):
    old = settings.RETENTION_IDEMPOTENCY_DAYS + 1
    open_purchase, closed = new_purchase(), new_purchase()
    Purchase.objects.filter(pk=open_purchase.pk).update(status=PurchaseStatus.PAYMENT_UNKNOWN)
    _close(closed)
    IdempotencyRecord.objects.all().delete()  # only the records made below
    gone = [
        _record(
            api_client, "k-closed", resource_type="purchase", resource_id=closed.pk, age_days=old
        ),
        _record(api_client, "k-quote", resource_type="quote", resource_id="q_1", age_days=old),
    ]
    kept = [
        _record(
            api_client,
            "k-open",
            resource_type="purchase",
            resource_id=open_purchase.pk,
            age_days=old,
        ),
        _record(api_client, "k-inflight", state="in_flight", age_days=old),
        _record(
            api_client, "k-recent", resource_type="purchase", resource_id=closed.pk, age_days=1
        ),
    ]

    result = retention_prune_table(policy=IDEMPOTENCY)

    assert (result.pruned, result.kept) == (2, 2)
    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == {r.key for r in kept}
    assert not IdempotencyRecord.objects.filter(pk__in=[r.pk for r in gone]).exists()


@pytest.mark.django_db(transaction=True)
def test_a_row_locked_by_a_worker_is_skipped_not_waited_for_and_pruned_later():
    ids = _outbox(6, age_days=settings.RETENTION_OUTBOX_DAYS + 1, processed=True, tag="lk")
    locked_id = ids[2]
    holding, release = threading.Event(), threading.Event()

    def worker():
        from django.db import connection as worker_connection

        try:
            with transaction.atomic():
                OutboxMessage.objects.select_for_update().get(pk=locked_id)
                holding.set()
                release.wait(30)
        finally:
            worker_connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert holding.wait(10)
        first = retention_prune_table(policy=OUTBOX, batch_size=2)
        assert first.pruned == 5 and first.due == 1
        assert list(OutboxMessage.objects.values_list("id", flat=True)) == [locked_id]
    finally:
        release.set()
        thread.join(10)

    second = retention_prune_table(policy=OUTBOX, batch_size=2)

    assert second.pruned == 1 and OutboxMessage.objects.count() == 0


def test_metrics_report_rows_pruned_and_due_per_table():
    _outbox(12, age_days=settings.RETENTION_OUTBOX_DAYS + 1, processed=True, tag="m")
    retention_prune_table(policy=OUTBOX, batch_size=5, max_batches=2)
    retention_run()  # every table; the outbox's remaining 2 go too

    families = {f.name: f for f in RetentionCollector()._collect()}

    def sample(name):
        return {
            s.labels["table"]: s.value
            for s in families[name].samples
            if not s.name.endswith("_created")
        }

    assert sample("verity_retention_pruned_rows")[OUTBOX.table] == 12
    assert sample("verity_retention_due_rows")[OUTBOX.table] == 0
    assert set(sample("verity_retention_due_rows")) == {
        OUTBOX.table,
        EVENTS.table,
        IDEMPOTENCY.table,
    }
    assert sample("verity_retention_last_run_age_seconds")[OUTBOX.table] < 60


def test_beat_runs_retention():
    app.loader.import_default_modules()
    entries = [
        e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "recovery.retention_prune"
    ]
    assert len(entries) == 1 and entries[0]["schedule"] > 0
    assert "recovery.retention_prune" in app.tasks
    _outbox(4, age_days=settings.RETENTION_OUTBOX_DAYS + 1, processed=True, tag="beat")

    assert app.tasks["recovery.retention_prune"].apply().get() == 4
    assert OutboxMessage.objects.count() == 0


def test_bad_command_input_is_refused_and_changes_nothing():
    _outbox(3, age_days=settings.RETENTION_OUTBOX_DAYS + 1, processed=True, tag="bad")

    with pytest.raises(CommandError):
        call_command("retention_prune", "--batch-size", "0")

    assert OutboxMessage.objects.count() == 3 and not RetentionState.objects.exists()
    call_command("retention_prune", "--table", OUTBOX.table)
    assert OutboxMessage.objects.count() == 0
