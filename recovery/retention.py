"""Retention: prune the append-heavy tables in short batches, never what is still needed.

The policy per table, and why, is in docs/retention.md. This module is its one
implementation: a beat task (`recovery.retention_prune`) calls `retention_run`; each
table's policy says which old rows may go now (`eligible`), which old rows must stay for
now because something still open needs them (`held`: they become eligible later), and
whether rows are archived (moved to RetentionArchive in the statement that deletes them)
or deleted.

How a run stays cheap and lock-light, whatever the table's size:
- ids grow with the row's time column (both are set at insert), so the last id older
  than the cutoff is found by a binary search on the primary key (~25 point reads), and
  a run walks the primary key upwards from `RetentionState.floor_id` in pages of
  RETENTION_BATCH_SIZE ids, never scanning by a time column that has no index;
- each page is one short transaction: the eligible rows of the page are locked with
  FOR UPDATE SKIP LOCKED (a row the relay or a webhook worker holds is skipped, not
  waited for), archived if the policy says so, and deleted; nothing else is locked;
- a run does at most RETENTION_MAX_BATCHES pages per table, and records what is still
  due, so a backlog (the first run on a year of history) is worked off over several
  beat ticks instead of one long job;
- runs resume where the previous one stopped (`RetentionState.cursor_id`): a sweep over
  the rows past the cutoff takes as many runs as it needs, and each run's budget goes to
  rows not yet looked at, so rows due behind many held rows (refund keys of purchases
  not fully refunded, events of open purchases) are always reached. Progress is monotonic:
  before, every run restarted at the first held row and, with more held rows than one
  run's budget, never got past them;
- when a sweep reaches the cutoff, the floor moves up past rows pruned and kept for good,
  stopping below the first row left in place, and the next sweep starts there: a held
  row is looked at again once per sweep and goes once what held it is closed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Count, Exists, F, Min, Model, OuterRef, Q
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from payments.enums import DISPUTE_CLOSED_STATUSES, TERMINAL_OUTCOMES, OperationKind, PurchaseStatus
from payments.models import Dispute, IdempotencyRecord, PaymentOperation, Purchase
from webhooks.models import EventResult, ProviderEvent

from .models import OutboxMessage, RetentionArchive, RetentionState

log = logging.getLogger(__name__)

# A purchase in one of these has nothing left to settle: no money movement in flight, no
# step to run, no dispute open. Every other status is "open" and keeps what it needs.
CLOSED_PURCHASE_STATUSES = (
    PurchaseStatus.COMPLETED,
    PurchaseStatus.PAYMENT_FAILED,
    PurchaseStatus.REFUNDED,
    PurchaseStatus.VOIDED,
    PurchaseStatus.CANCELLED,
    PurchaseStatus.EXPIRED,
    PurchaseStatus.DISPUTE_WON,
    PurchaseStatus.DISPUTE_LOST,
)
# Event results after which nothing reads the event again on its own. QUARANTINED is
# final for the relay but waits for a person (release), HELD and PENDING wait for a
# record to settle: those three are held, whatever their age.
_EVENT_DONE = (EventResult.APPLIED, EventResult.IGNORED, EventResult.REJECTED)


def _open_purchase(ref: OuterRef) -> Exists:
    return Exists(Purchase.objects.filter(pk=ref).exclude(status__in=CLOSED_PURCHASE_STATUSES))


def _open_operation(ref: OuterRef) -> Exists:
    return Exists(PaymentOperation.objects.filter(pk=ref).exclude(outcome__in=TERMINAL_OUTCOMES))


def _open_operation_of_purchase(ref: OuterRef) -> Exists:
    return Exists(
        PaymentOperation.objects.filter(purchase_id=ref).exclude(outcome__in=TERMINAL_OUTCOMES)
    )


def _open_dispute(**match: OuterRef) -> Exists:
    return Exists(Dispute.objects.filter(**match).exclude(status__in=DISPUTE_CLOSED_STATUSES))


def _event_needed() -> Q:
    """An event an open purchase, operation or dispute may still need (the timeline a
    person reads to settle it, the observation a read-back is compared with)."""
    return (
        Q(_open_purchase(OuterRef("purchase_id")))
        | Q(_open_operation(OuterRef("operation_id")))
        | Q(_open_operation_of_purchase(OuterRef("purchase_id")))
        | Q(_open_dispute(purchase_id=OuterRef("purchase_id")))
        | Q(_open_dispute(pk=OuterRef("object_id")))
    )


def _idempotency_needed() -> Q:
    """A finished key whose resource is still open: a retrying agent must get a replay of
    that purchase/operation, never a second one
    (docs/walkthrough.md#api-rules-the-code-relies-on), for as long as it is open."""
    purchase = Q(resource_type="purchase") & (
        Q(_open_purchase(OuterRef("resource_id")))
        | Q(_open_operation_of_purchase(OuterRef("resource_id")))
    )
    operation = Q(resource_type="operation") & (
        Q(_open_operation(OuterRef("resource_id")))
        | Q(_refund_with_room_left(OuterRef("resource_id")))
    )
    # An ACP key names its checkout session (acp/views.py RESOURCE); the session's purchase
    # is reached through its reverse relation (`acp_session`), so recovery imports no acp.
    session = Q(resource_type="acp_session") & Q(
        _open_purchase_of_acp_session(OuterRef("resource_id"))
    )
    return purchase | operation | session


def _open_purchase_of_acp_session(ref: OuterRef) -> Q:
    purchases = Purchase.objects.filter(acp_session__pk=ref)
    return Exists(purchases.exclude(status__in=CLOSED_PURCHASE_STATUSES)) | Exists(
        PaymentOperation.objects.filter(purchase__acp_session__pk=ref).exclude(
            outcome__in=TERMINAL_OUTCOMES
        )
    )


def _refund_with_room_left(ref: OuterRef) -> Exists:
    """A refund whose purchase is not fully refunded: the payment still has room, so the
    storefront's retry of that same refund request (same key, same body) would be a new,
    second refund once its record were gone. Kept until the purchase is
    `refunded`; refunds are few, so these records stay small."""
    return Exists(
        PaymentOperation.objects.filter(pk=ref, kind=OperationKind.REFUND).exclude(
            purchase__status=PurchaseStatus.REFUNDED
        )
    )


@dataclass(frozen=True)
class Policy:
    table: str  # the metric label (the database table)
    model: type[Model]
    time_field: str  # set at insert, grows with the id
    days_setting: str
    archive: bool  # moved to RetentionArchive (kept), not dropped
    # Old rows that may go now / old rows that must stay for now (eligible later).
    eligible: Callable[[datetime], Q]
    held: Callable[[datetime], Q]

    def days(self) -> int:
        return int(getattr(settings, self.days_setting))


POLICIES: tuple[Policy, ...] = (
    Policy(
        table=OutboxMessage._meta.db_table,
        model=OutboxMessage,
        time_field="created_at",
        days_setting="RETENTION_OUTBOX_DAYS",
        archive=False,
        # Processed rows are read by nothing (the relay, the stuck queue and the metrics
        # read unprocessed rows only); an unprocessed row is work, never pruned.
        eligible=lambda cutoff: Q(processed_at__isnull=False, processed_at__lt=cutoff),
        held=lambda cutoff: Q(processed_at__isnull=True) | Q(processed_at__gte=cutoff),
    ),
    Policy(
        table=ProviderEvent._meta.db_table,
        model=ProviderEvent,
        time_field="received_at",
        days_setting="RETENTION_WEBHOOK_EVENT_DAYS",
        archive=True,
        eligible=lambda cutoff: (
            Q(received_at__lt=cutoff, result__in=_EVENT_DONE) & ~_event_needed()
        ),
        held=lambda cutoff: (
            ~Q(result__in=_EVENT_DONE) | _event_needed() | Q(received_at__gte=cutoff)
        ),
    ),
    Policy(
        table=IdempotencyRecord._meta.db_table,
        model=IdempotencyRecord,
        time_field="created_at",
        days_setting="RETENTION_IDEMPOTENCY_DAYS",
        archive=False,
        eligible=lambda cutoff: (
            Q(created_at__lt=cutoff, state=IdempotencyRecord.State.DONE) & ~_idempotency_needed()
        ),
        held=lambda cutoff: (
            Q(state=IdempotencyRecord.State.IN_FLIGHT)
            | _idempotency_needed()
            | Q(created_at__gte=cutoff)
        ),
    ),
)


def policy_for(table: str) -> Policy:
    for policy in POLICIES:
        if policy.table == table:
            return policy
    raise KeyError(table)


@dataclass(frozen=True)
class PruneResult:
    table: str
    pruned: int
    due: int  # eligible rows left after this run (a backlog the next runs work off)
    kept: int  # old rows held for now
    batches: int
    seconds: float


def _last_id_before(model: type[Model], field: str, cutoff: datetime, floor: int) -> int:
    """The last id (above `floor`) whose `field` is older than `cutoff`, by binary search on
    the primary key: ids and insert times grow together, so this is ~log2(rows) indexed
    point reads instead of a scan by a time column that has no index."""
    rows = model._default_manager.filter(pk__gt=floor).order_by("pk").values_list("pk", field)
    first = rows.first()
    if first is None or first[1] >= cutoff:
        return floor
    last = model._default_manager.order_by("-pk").values_list("pk", field).first()
    assert last is not None  # `first` is a row
    if last[1] < cutoff:
        last_pk: int = last[0]
        return last_pk
    # Invariant: row `lo` is older than the cutoff; every row at or above `hi` is not.
    lo: int
    hi: int
    lo, hi = first[0], last[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        row = rows.filter(pk__gte=mid, pk__lt=hi).first()
        if row is None:
            hi = mid
        elif row[1] < cutoff:
            lo = row[0]
        else:
            hi = row[0]
    return lo


def _archive_and_delete(policy: Policy, ids: list[int]) -> int:
    """Inside the batch's transaction: move (archive) or delete the rows `ids`."""
    if not ids:
        return 0
    model = policy.model
    if not policy.archive:
        deleted: int = model._default_manager.filter(pk__in=ids)._raw_delete(
            model._default_manager.db
        )
        return deleted
    if connection.vendor == "postgresql":
        # One statement: the rows are copied as they were deleted (no window in which a
        # row is in neither table or in both).
        with connection.cursor() as c:
            c.execute(
                f"WITH moved AS (DELETE FROM {model._meta.db_table} WHERE id = ANY(%s) "
                "RETURNING *) "
                f"INSERT INTO {RetentionArchive._meta.db_table} (source, row_id, row, archived_at) "
                "SELECT %s, m.id, to_jsonb(m), now() FROM moved m",
                [ids, policy.table],
            )
            moved: int = c.rowcount
            return moved
    # The embedded SQLite default: small volumes, the same effect row by row.
    rows = list(model._default_manager.filter(pk__in=ids).values())
    RetentionArchive.objects.bulk_create(
        [
            RetentionArchive(
                source=policy.table,
                row_id=r["id"],
                row=json.loads(json.dumps(r, cls=DjangoJSONEncoder)),
            )
            for r in rows
        ]
    )
    model._default_manager.filter(pk__in=[r["id"] for r in rows])._raw_delete(
        model._default_manager.db
    )
    return len(rows)


def retention_prune_table(
    *,
    policy: Policy,
    now: datetime | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
) -> PruneResult:
    """Prune one table: pages of at most `batch_size` ids, one short transaction each.

    A run resumes the table's sweep where the previous run stopped (`cursor_id`), so its
    budget is spent on rows not yet looked at in this sweep, however many held rows lie
    before them; a sweep that reaches the cutoff ends, moves the floor up to just below
    the first row it left in place, and the next run starts a new sweep there (held rows
    are looked at again once per sweep, and go once what held them is closed)."""
    started = time.monotonic()
    now = now or timezone.now()
    batch_size = batch_size or settings.RETENTION_BATCH_SIZE
    max_batches = max_batches or settings.RETENTION_MAX_BATCHES
    cutoff = now - timedelta(days=policy.days())
    model = policy.model
    state, _ = RetentionState.objects.get_or_create(table=policy.table)
    floor = state.floor_id
    top = _last_id_before(model, policy.time_field, cutoff, floor)
    eligible = policy.eligible(cutoff)
    old_rows = Q(**{f"{policy.time_field}__lt": cutoff})
    cursor = max(state.cursor_id, floor)
    first_left, sweep_kept, sweep_skipped = (
        state.sweep_first_left_id,
        state.sweep_kept,
        state.sweep_skipped,
    )
    if cursor == floor:  # a new sweep
        first_left, sweep_kept, sweep_skipped = None, 0, 0
    pruned = batches = 0
    while cursor < top and batches < max_batches:
        page = list(
            model._default_manager.filter(pk__gt=cursor, pk__lte=top)
            .order_by("pk")
            .values_list("pk", flat=True)[:batch_size]
        )
        if not page:
            cursor = top
            break
        page_range = Q(pk__gt=cursor, pk__lte=page[-1])
        with transaction.atomic():
            ids = list(
                model._default_manager.filter(page_range)
                .filter(eligible)
                .select_for_update(skip_locked=True)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
            pruned += _archive_and_delete(policy, ids)
        # What the page left: held rows, and eligible rows a worker held the lock of (an
        # old row left that is not eligible is held). Evaluated on the rows left only:
        # few, unless the page is all held rows.
        left = model._default_manager.filter(page_range).aggregate(
            first=Min("pk"), old=Count("pk", filter=old_rows), skipped=Count("pk", filter=eligible)
        )
        if left["first"] is not None:
            first_left = left["first"] if first_left is None else min(first_left, left["first"])
            sweep_kept += left["old"] - left["skipped"]
            sweep_skipped += left["skipped"]
        cursor = page[-1]
        batches += 1
    # Rows past the cutoff not yet looked at in this sweep (an upper bound of what is due
    # there: held rows among them are counted kept once the sweep reaches them), counted
    # on the primary key only and capped, so the figure costs the same whatever the backlog.
    cap = getattr(settings, "RETENTION_DUE_COUNT_CAP", 1_000_000)
    ahead = (
        model._default_manager.filter(pk__gt=cursor, pk__lte=top).values("pk")[:cap].count()
        if cursor < top
        else 0
    )
    due = ahead + sweep_skipped
    swept = cursor >= top
    if swept:
        # The sweep is over: the next one starts just below the first row left in place.
        kept = sweep_kept
        new_floor = top if first_left is None else max(floor, first_left - 1)
        values = dict(
            floor_id=new_floor,
            cursor_id=new_floor,
            sweep_first_left_id=None,
            sweep_kept=0,
            sweep_skipped=0,
        )
    else:
        # Mid-sweep: the last complete sweep's figure, or this one's so far if larger.
        kept = max(state.kept, sweep_kept)
        values = dict(
            cursor_id=cursor,
            sweep_first_left_id=first_left,
            sweep_kept=sweep_kept,
            sweep_skipped=sweep_skipped,
        )
    seconds = time.monotonic() - started
    RetentionState.objects.filter(pk=state.pk).update(
        pruned_total=F("pruned_total") + pruned,
        due=due,
        kept=kept,
        last_run_at=timezone.now(),
        last_run_seconds=seconds,
        **values,
    )
    if pruned or due:
        log.info(
            "retention %s: %d pruned (%s), %d still due, %d kept, %d batch(es), %.1fs",
            policy.table,
            pruned,
            "archived" if policy.archive else "deleted",
            due,
            kept,
            batches,
            seconds,
        )
    return PruneResult(policy.table, pruned, due, kept, batches, seconds)


def retention_run(*, now: datetime | None = None) -> list[PruneResult]:
    """Every table's policy, one after the other (the beat task)."""
    return [retention_prune_table(policy=p, now=now) for p in POLICIES]


# -- metrics ------------------------------------------------------------------------------


class RetentionCollector:
    """verity_retention_* from RetentionState: one small query per scrape, right whichever
    worker pruned (a process counter in the worker would be invisible at the web's
    /metrics). Pruned rows are a counter: the column only grows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None

    def describe(self) -> list[Metric]:
        return []  # registering must not query (as recovery.metrics.DatabaseCollector)

    def collect(self) -> Iterator[Metric]:
        # Cached for METRICS_CACHE_SECONDS, as the database collector: a burst of scrapes
        # shares one query.
        ttl = getattr(settings, "METRICS_CACHE_SECONDS", 5.0)
        with self._lock:
            now = time.monotonic()
            if not (ttl > 0 and self._cached and now - self._cached[0] < ttl):
                self._cached = (now, list(self._collect()))
            families = self._cached[1]
        yield from families

    def _collect(self) -> Iterator[Metric]:
        pruned = CounterMetricFamily(
            "verity_retention_pruned_rows",
            "Rows pruned (deleted or archived) by retention, all time",
            labels=["table"],
        )
        due = GaugeMetricFamily(
            "verity_retention_due_rows",
            "Rows past their retention still in the table after the last run (a backlog)",
            labels=["table"],
        )
        kept = GaugeMetricFamily(
            "verity_retention_kept_rows",
            "Rows past their retention kept because something open needs them",
            labels=["table"],
        )
        age = GaugeMetricFamily(
            "verity_retention_last_run_age_seconds",
            "Seconds since retention last ran on the table",
            labels=["table"],
        )
        try:
            states = list(RetentionState.objects.all())
        except Exception:  # a scrape must never 500 because one query failed
            log.exception("retention metrics unreadable")
            states = []
        now = timezone.now()
        for s in states:
            pruned.add_metric([s.table], s.pruned_total)
            due.add_metric([s.table], s.due)
            kept.add_metric([s.table], s.kept)
            if s.last_run_at:
                age.add_metric([s.table], max(0.0, (now - s.last_run_at).total_seconds()))
        yield from (pruned, due, kept, age)


_collector: RetentionCollector | None = None
_collector_lock = threading.Lock()


def register_retention_collector() -> None:
    """Idempotent; called by the /metrics view next to the database collector."""
    global _collector
    with _collector_lock:
        if _collector is None:
            _collector = RetentionCollector()
            REGISTRY.register(_collector)
