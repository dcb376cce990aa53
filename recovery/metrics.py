"""Prometheus metrics (docs/recovery.md, Metrics), served at /metrics from the default registry.

Two kinds:
- counters other apps increment where the event happens (module-level, import them:
  `from recovery.metrics import IDEMPOTENT_REPLAYS`). They are per process: web-process
  events (replays, blocked duplicates) are complete at the web's /metrics; for several
  gunicorn workers set PROMETHEUS_MULTIPROC_DIR (prometheus_client multiprocess mode).
- figures computed from PostgreSQL at scrape time by `DatabaseCollector`, so they are
  right whichever process did the work (purchases by channel and status, unknown
  operations and oldest age, compensation needed, outbox backlog, escalations,
  discrepancies, operation and webhook results, manual resolutions, time from provider success to
  order, notification delay).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, QuerySet
from django.utils import timezone
from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from audit.models import Resolution
from events.models import DeliveryState, WebhookDelivery, WebhookEndpoint
from payments.enums import (
    DISPUTE_CLOSED_STATUSES,
    OVERTURN_CAUSE,
    PAYMENT_KINDS,
    CallPurpose,
    Origin,
    Outcome,
    Rail,
)
from payments.models import Dispute, OperationTransition, PaymentOperation, ProviderCall, Purchase
from webhooks.models import EventResult, ProviderEvent

from . import selectors
from .models import EmailMessage, Order, OutboxMessage, SettlementDiscrepancy, WorkflowHalt

log = logging.getLogger(__name__)

# -- counters (increment at the event) -------------------------------------------------
IDEMPOTENT_REPLAYS = Counter(
    "verity_idempotent_replays", "Requests answered from an Idempotency-Key record", ["route"]
)
BLOCKED_DUPLICATES = Counter(
    "verity_blocked_duplicates",
    "Attempts refused because they would duplicate a money movement or an in-flight request",
    ["reason"],
)
MANUAL_RESOLUTIONS = Counter(
    "verity_manual_resolutions", "Operations settled by a person", ["outcome"]
)
REFUND_OUTCOMES = Counter(
    "verity_refund_outcomes", "Refund/void operations reaching an outcome", ["kind", "outcome"]
)

_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600, 86400)
_WINDOW_HOURS = 24
_READBACK_WINDOW_MINUTES = 15


def _delay_histogram(
    name: str, doc: str, rows: QuerySet[Any], at: str, since: datetime
) -> HistogramMetricFamily:
    """Histogram of (rows.<at> − the purchase's provider success), for successes since
    `since`, as one aggregate: COUNT(*) FILTER per bucket and the sum, nothing per row."""
    from django.db.models import (
        DurationField,
        ExpressionWrapper,
        F,
        OuterRef,
        Q,
        Subquery,
        Sum,
        Value,
    )
    from django.db.models.functions import Greatest

    settled = (
        PaymentOperation.objects.filter(
            purchase_id=OuterRef("purchase_id"),
            kind__in=PAYMENT_KINDS,
            outcome=Outcome.SUCCEEDED,
            settled_at__gte=since,
        )
        .order_by("settled_at")
        .values("settled_at")[:1]
    )
    # Only the rows of purchases paid in the window (the partial index of succeeded
    # operations by settled_at, then each row by its purchase_id index): the statement
    # reads a day of rows, not every order or e-mail ever written.
    paid = PaymentOperation.objects.filter(
        kind__in=PAYMENT_KINDS, outcome=Outcome.SUCCEEDED, settled_at__gte=since
    ).values("purchase_id")
    delays = (
        rows.filter(purchase_id__in=paid)
        .annotate(paid_at=Subquery(settled))
        .filter(paid_at__isnull=False)
        .annotate(
            delay=Greatest(
                ExpressionWrapper(F(at) - F("paid_at"), output_field=DurationField()),
                Value(timedelta(0)),
                output_field=DurationField(),
            )
        )
    )
    figures = delays.aggregate(
        n=Count("pk"),
        total=Sum("delay"),
        **{
            f"le{i}": Count("pk", filter=Q(delay__lte=timedelta(seconds=bound)))
            for i, bound in enumerate(_BUCKETS)
        },
    )
    buckets = [(str(float(bound)), figures[f"le{i}"]) for i, bound in enumerate(_BUCKETS)]
    buckets.append(("+Inf", figures["n"]))
    total = figures["total"].total_seconds() if figures["total"] else 0.0
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


class DatabaseCollector:
    """Gauges read from the database on every scrape (cheap indexed counts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None

    def describe(self) -> list[Metric]:
        # Without this, registering the collector runs collect() (the default registry
        # auto-describes) and the first scrape of a process queried everything twice.
        return []

    def collect(self) -> Iterator[Metric]:
        # Cached for METRICS_CACHE_SECONDS per process: scrapes in a burst share one set
        # of queries instead of each holding a worker on the database.
        ttl = getattr(settings, "METRICS_CACHE_SECONDS", 5.0)
        with self._lock:
            now = time.monotonic()
            if ttl > 0 and self._cached and now - self._cached[0] < ttl:
                families = self._cached[1]
            else:
                try:
                    families = list(self._collect())
                    self._cached = (now, families)
                except Exception:  # a scrape must never 500 because one query failed
                    log.exception("metrics collection from the database failed")
                    families = []
        yield from families

    def _collect(self) -> Iterator[Metric]:
        count, age = selectors.unknown_operations_stats()
        yield GaugeMetricFamily(
            "verity_unknown_operations", "Operations whose outcome is unknown", value=count
        )
        yield GaugeMetricFamily(
            "verity_unknown_oldest_age_seconds", "Age of the oldest unknown operation", value=age
        )
        yield GaugeMetricFamily(
            "verity_compensation_needed",
            "Steps waiting for a person or for a compensation to settle",
            value=selectors.compensation_needed_count(),
        )
        yield GaugeMetricFamily(
            "verity_outbox_backlog", "Unprocessed outbox messages", value=selectors.outbox_backlog()
        )
        yield GaugeMetricFamily(
            "verity_outbox_stuck",
            "Outbox messages retried repeatedly or old",
            value=selectors.queue_stuck_outbox(limit=100000).count(),
        )
        yield GaugeMetricFamily(
            "verity_escalated_operations",
            "Open operations escalated to a recovery owner",
            value=PaymentOperation.objects.filter(
                escalated_at__isnull=False,
                outcome__in=(Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER),
            ).count(),
        )
        yield GaugeMetricFamily(
            "verity_settlement_discrepancies_open",
            "Open settlement discrepancies",
            value=SettlementDiscrepancy.objects.filter(resolved_at__isnull=True).count(),
        )

        ops = GaugeMetricFamily(
            "verity_operations", "Operations by kind and outcome", labels=["kind", "outcome"]
        )
        for row in PaymentOperation.objects.values("kind", "outcome").annotate(n=Count("id")):
            ops.add_metric([row["kind"], row["outcome"]], row["n"])
        yield ops

        # By the way in (REST API, MCP, ACP, drills): ACP purchases counted like any other.
        # One GROUP BY whatever the volume (tests/security/test_metrics_exposure.py).
        purchases = GaugeMetricFamily(
            "verity_purchases", "Purchases by channel and status", labels=["channel", "status"]
        )
        for by in Purchase.objects.values("channel", "status").annotate(n=Count("id")):
            purchases.add_metric([by["channel"], by["status"]], by["n"])
        yield purchases

        yield from _webhook_event_gauges()

        yield GaugeMetricFamily(
            "verity_manual_resolutions_recorded",
            "Manual resolutions recorded (all time)",
            value=Resolution.objects.count(),
        )
        # Provider evidence outranks a person
        # (docs/reliability.md#the-providers-record-outranks-a-person): every overturn, all time (a
        # counter in effect: rows are append-only), and those not yet reviewed.

        yield GaugeMetricFamily(
            "verity_manual_resolutions_overturned",
            "Manual resolutions overturned by verified provider evidence (all time)",
            value=OperationTransition.objects.filter(cause=OVERTURN_CAUSE, field="outcome").count(),
        )
        yield GaugeMetricFamily(
            "verity_duplicate_charges",
            "Second confirmed charges on one purchase (each compensated by a linked refund)",
            value=PaymentOperation.objects.filter(is_duplicate=True).count(),
        )

        # Time from provider success to order (and to the confirmation e-mail), over the
        # last day; computed here so it does not matter which worker did the step. One
        # aggregate query each (buckets counted in SQL): never a list of ids, whatever the
        # volume (20 000 ids would make a 640 KB statement).
        since = timezone.now() - timedelta(hours=_WINDOW_HOURS)
        yield _delay_histogram(
            "verity_order_after_payment_seconds",
            "Provider success to order row (last 24 h)",
            Order.objects.all(),
            "created_at",
            since,
        )
        yield _delay_histogram(
            "verity_notification_delay_seconds",
            "Provider success to confirmation e-mail sent (last 24 h)",
            EmailMessage.objects.filter(kind="confirmation", sent_at__isnull=False),
            "sent_at",
            since,
        )

        yield from self._collect_alert_inputs()

    def _collect_alert_inputs(self) -> Iterator[Metric]:
        """Figures the alert rules in deploy/prometheus/alerts.yml need."""
        from django.db.models import Min

        now = timezone.now()
        # Past the grace period already (recovery.selectors.paid_without_order).
        pwo = selectors.paid_without_order(limit=None)
        agg = pwo.aggregate(n=Count("id"), oldest=Min("updated_at"))
        yield GaugeMetricFamily(
            "verity_paid_without_order",
            "Paid purchases with no order past the grace period",
            value=agg["n"],
        )
        yield GaugeMetricFamily(
            "verity_paid_without_order_oldest_age_seconds",
            "Age of the oldest paid-without-order purchase (since it was last updated)",
            value=(now - agg["oldest"]).total_seconds() if agg["oldest"] else 0.0,
        )

        due = OutboxMessage.objects.filter(
            processed_at__isnull=True, available_at__lte=now
        ).aggregate(oldest=Min("available_at"))["oldest"]
        yield GaugeMetricFamily(
            "verity_outbox_oldest_due_age_seconds",
            "How long the oldest due, unprocessed outbox message has waited (relay lag)",
            value=(now - due).total_seconds() if due else 0.0,
        )

        readbacks = GaugeMetricFamily(
            "verity_reconcile_readbacks_recent",
            f"Reconcile read-backs in the last {_READBACK_WINDOW_MINUTES} minutes by "
            "classification",
            labels=["classification"],
        )
        for row in (
            ProviderCall.objects.filter(
                purpose=CallPurpose.RECONCILE,
                started_at__gte=now - timedelta(minutes=_READBACK_WINDOW_MINUTES),
            )
            .values("classification")
            .annotate(n=Count("id"))
        ):
            readbacks.add_metric([row["classification"] or "none"], row["n"])
        yield readbacks

        yield from _dispute_gauges(now)
        yield from _x402_gauges(now)

        yield from _storefront_webhook_gauges(now)

        halts = GaugeMetricFamily(
            "verity_workflow_halt_age_seconds",
            "Seconds each active workflow halt has been on",
            labels=["name"],
        )
        for name, created in WorkflowHalt.objects.values_list("name", "created_at"):
            halts.add_metric([name], max(0.0, (now - created).total_seconds()))
        yield halts


def _storefront_webhook_gauges(now: datetime) -> Iterator[Metric]:
    """Storefront webhook endpoints (events/): how many Verity disabled because every
    delivery failed (their owners are told: console page, alert), and the oldest due
    delivery's age. Counts and ages only: never a URL or a secret."""
    yield GaugeMetricFamily(
        "verity_webhook_endpoints_disabled_failing",
        "Storefront webhook endpoints disabled because every delivery failed",
        value=WebhookEndpoint.objects.filter(
            enabled=False, disabled_reason__startswith="every delivery"
        ).count(),
    )
    oldest = (
        WebhookDelivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    yield GaugeMetricFamily(
        "verity_webhook_delivery_oldest_due_seconds",
        "Seconds the oldest due storefront webhook delivery has waited",
        value=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
    )


# Results that wait for something (a record to settle, a person): few rows whatever the
# history, each one work. Counted exactly, through the partial index on these results.
_WAITING_RESULTS = (
    EventResult.PENDING.value,
    EventResult.HELD.value,
    EventResult.QUARANTINED.value,
)


def _webhook_event_gauges() -> Iterator[Metric]:
    """verity_webhook_events{result} and the held events' count and age, at a cost that
    does not grow with stored history (5 M stored events made one GROUP BY over all of
    them take 7.6 s; docs/retention.md). Waiting results are counted exactly (one query on
    the small partial index of waiting events); the final ones (applied, ignored,
    rejected: the bulk of the table) are PostgreSQL's own statistics, kept by autovacuum's
    ANALYZE: reltuples times the column's value frequency, the planner's estimate, read
    from the catalog in one query. On SQLite (the small embedded default) they are exact."""
    waiting = {
        row["result"]: row
        for row in ProviderEvent.objects.filter(result__in=_WAITING_RESULTS)
        .values("result")
        .annotate(n=Count("id"), oldest=Min("received_at"))
    }
    events = GaugeMetricFamily(
        "verity_webhook_events",
        "Stored webhook events by result (pending, held, quarantined exact; the final "
        "results estimated from PostgreSQL's table statistics)",
        labels=["result"],
    )
    for result in _WAITING_RESULTS:
        events.add_metric([result], waiting[result]["n"] if result in waiting else 0)
    for result, n in _final_event_counts().items():
        events.add_metric([result], n)
    yield events

    # Held events wait for a record to settle (webhooks.services): each has an owner,
    # and this age is what VerityHeldEventsTooOld reads.
    held = waiting.get(EventResult.HELD.value)
    yield GaugeMetricFamily(
        "verity_webhook_held_events",
        "Provider events held waiting for a record to settle",
        value=held["n"] if held else 0,
    )
    yield GaugeMetricFamily(
        "verity_webhook_held_oldest_age_seconds",
        "Age of the oldest held provider event (since it was received)",
        value=(timezone.now() - held["oldest"]).total_seconds() if held else 0.0,
    )


def _final_event_counts() -> dict[str, float]:
    final = [r for r in EventResult.values if r not in _WAITING_RESULTS]
    if connection.vendor != "postgresql":
        found = dict(
            ProviderEvent.objects.filter(result__in=final)
            .values("result")
            .annotate(n=Count("id"))
            .values_list("result", "n")
        )
        return {r: found.get(r, 0) for r in final}
    with connection.cursor() as c:
        c.execute(
            "SELECT c.reltuples, s.null_frac, s.n_distinct, "
            "s.most_common_vals::text::text[], s.most_common_freqs "
            "FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = current_schema() "
            "AND s.tablename = c.relname AND s.attname = 'result' "
            "WHERE c.oid = %s::regclass",
            [ProviderEvent._meta.db_table],
        )
        row = c.fetchone()
    return {r: round(n) for r, n in _estimate_by_value(row, final).items()}


def _estimate_by_value(row: tuple[Any, ...] | None, values: Iterable[str]) -> dict[str, float]:
    """The planner's row estimate for `col = value`, for each value: its frequency among
    the most common values, else an equal share of what those leave (PostgreSQL's
    var_eq_const), times the table's estimated rows. No statistics yet: zeros."""
    if row is None or row[0] is None or row[0] <= 0 or row[2] is None:
        return {v: 0.0 for v in values}
    reltuples, null_frac, n_distinct, mcv, freqs = row
    mcv, freqs = list(mcv or []), list(freqs or [])
    distinct = n_distinct if n_distinct > 0 else -n_distinct * reltuples
    others = max(1.0, distinct - len(mcv))
    rest = max(0.0, 1.0 - (null_frac or 0.0) - sum(freqs)) / others
    return {v: reltuples * (freqs[mcv.index(v)] if v in mcv else rest) for v in values}


def _dispute_gauges(now: datetime) -> Iterator[Metric]:
    """Open disputes, and those whose evidence is due within 48 hours (or overdue): the
    VerityDisputeEvidenceDue alert and the finance queue read the same rows."""

    open_disputes = Dispute.objects.exclude(status__in=DISPUTE_CLOSED_STATUSES)
    yield GaugeMetricFamily(
        "verity_disputes_open", "Open disputes at the provider", value=open_disputes.count()
    )
    yield GaugeMetricFamily(
        "verity_disputes_evidence_due_soon",
        "Open disputes whose evidence is due within 48 hours or overdue",
        value=open_disputes.filter(evidence_due_by__lte=now + timedelta(hours=48)).count(),
    )
    yield GaugeMetricFamily(
        "verity_external_operations_unreviewed",
        "Refunds/captures/cancels made outside Verity not yet acknowledged by a person",
        value=PaymentOperation.objects.filter(
            origin=Origin.PROVIDER, reviewed_at__isnull=True
        ).count(),
    )


def _x402_gauges(now: datetime) -> Iterator[Metric]:
    """x402 settlements broadcast but not yet confirmed on chain (awaiting_provider or
    unknown on rail x402), and the age of the oldest: a stuck chain or facilitator shows
    here before any customer asks."""
    from django.db.models import Min

    from payments.models import PaymentOperation

    open_ops = PaymentOperation.objects.filter(
        rail=Rail.X402, outcome__in=(Outcome.AWAITING_PROVIDER, Outcome.UNKNOWN)
    )
    oldest = open_ops.aggregate(m=Min("created_at"))["m"]
    yield GaugeMetricFamily(
        "verity_x402_pending_settlements",
        "x402 settlements not yet confirmed on chain",
        value=open_ops.count(),
    )
    yield GaugeMetricFamily(
        "verity_x402_pending_oldest_age_seconds",
        "Age of the oldest x402 settlement not yet confirmed",
        value=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
    )
    # Successes the chain took back after the deliverable went out (a reorg, then the
    # payer's cancel): all time (history rows are append-only) and those support has not
    # reviewed yet; and proving logs another operation already claimed (someone tried to
    # count one transfer twice). payments.services.x402_finality, .x402_reads.
    from payments.services.x402_finality import X402_VANISHED_CAUSE, x402_transfers_reversed
    from payments.services.x402_reads import PROOF_CLAIM_REFUSED_CAUSE

    yield GaugeMetricFamily(
        "verity_x402_transfers_reversed",
        "x402 payments whose transfer left the chain after success (all time)",
        value=OperationTransition.objects.filter(
            cause=X402_VANISHED_CAUSE, field="outcome"
        ).count(),
    )
    yield GaugeMetricFamily(
        "verity_x402_transfers_reversed_open",
        "x402 payments the chain took back, not yet reviewed by support",
        value=x402_transfers_reversed().count(),
    )
    yield GaugeMetricFamily(
        "verity_x402_proof_claims_refused",
        "Reads whose proving log another operation already claimed (all time)",
        value=OperationTransition.objects.filter(cause=PROOF_CLAIM_REFUSED_CAUSE).count(),
    )
    yield from _x402_refund_float_gauges()


def _x402_refund_float_gauges() -> Iterator[Metric]:
    """The refund account's balance and the level below which finance tops it up: refunds on
    x402 are sent from a separate account holding a small float, so an empty float means
    refunds fail. Both families are always declared (the alert's inputs
    exist on every scrape); the balance has a sample only when a refund key is set and the
    chain answered (one eth_call, outside any transaction)."""
    threshold = GaugeMetricFamily(
        "verity_x402_refund_low_balance",
        "x402 refund account level below which finance tops it up (X402_REFUND_LOW_BALANCE, "
        "whole tokens)",
    )
    balance = GaugeMetricFamily(
        "verity_x402_refund_balance",
        "x402 refund account's balance of the asset (whole tokens, e.g. USDC)",
    )
    if settings.X402_ENABLED and settings.X402_REFUND_PRIVATE_KEY:
        from payments.providers.x402 import refund_float

        threshold.add_metric([], float(settings.X402_REFUND_LOW_BALANCE))
        try:
            found = refund_float()
        except Exception:  # noqa: BLE001 - an unreachable chain: no sample, not a 500
            log.warning("x402 refund account balance unreadable", exc_info=True)
            found = None
        if found is not None:
            balance.add_metric([], found.tokens)
    yield threshold
    yield balance


_collector: DatabaseCollector | None = None
_collector_lock = threading.Lock()


def register_database_collector() -> None:
    """Idempotent; called by the /metrics view (web processes only)."""
    global _collector
    with _collector_lock:
        if _collector is None:
            _collector = DatabaseCollector()
            REGISTRY.register(_collector)
