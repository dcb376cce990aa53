"""Read-only queries for the console: queues, search, the purchase timeline.

Reads other apps' models directly but never writes them (writes go through each app's
services). Everything returned is a safe field: no card data, no secrets; provider
event payloads are only handed out to roles with VIEW_REDACTED_PAYLOAD.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import Any

from django.conf import settings
from django.contrib import messages as message_levels
from django.db import connection
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from events import selectors as event_selectors
from payments.api.presenters import operation_next_action
from payments.enums import (
    PAYMENT_KINDS,
    CallPurpose,
    Classification,
    HoldState,
    OperationKind,
    Outcome,
    Owner,
    Rail,
    Reason,
    Stage,
)
from payments.models import (
    ApiClient,
    BuyerConfirmation,
    Hold,
    OperationTransition,
    PaymentOperation,
    ProviderCall,
    Purchase,
)
from payments.money import MoneyInputError, format_money, parse_money
from payments.next_action import NextStep, Situation, operation_next_step, staff_next_step
from payments.providers.base import payment_provider
from payments.services import provider_for_rail
from payments.services.common import purchase_own_payments, purchase_refund_room
from recovery.models import (
    EmailMessage,
    LedgerEntry,
    Order,
    OutboxMessage,
    RecoveryDecision,
    SettlementDiscrepancy,
    StepRun,
    StepState,
    WorkflowHalt,
)
from support.access import Action, can
from support.models import AuditEntry, Incident, IncidentStatus, Note, Resolution
from support.owners import staff_owner

# The console's queues live in one registry (support.queues); re-exported for the views.
from support.queues import (  # noqa: F401
    MISMATCH_PREFIX,
    PAID_STATUSES,
    QUEUE_PAGE_SIZE,
    QUEUES,
    STEP_TROUBLE,
    QueueItem,
    QueueSpec,
    QueueSummary,
    compensation_operations,
    compensation_steps,
    discrepancy_summary,
    paid_without_order,
    quarantined_events,
    queue_items,
    queue_summaries,
    unknown_operations,
)
from support.timefmt import relative
from webhooks.models import ProviderEvent


def _money(amount: int | None, currency: str) -> str:
    return format_money(amount, currency)


# ------------------------------------------------------------------------ dashboard


@dataclass(frozen=True)
class Exposure:
    currency: str
    client: str
    amount: int
    operations: int


# Unknown exposure, hash-joined: the unknown operations' ids (op_open_by_outcome_idx) and
# the reserved holds (hold_reserved_idx) are read once each. Written as the ORM's join, the
# planner probes the operation of every reserved hold by primary key instead (a nested loop:
# ~4 pages a hold, 86 k pages and 150-400 ms at 1 M purchases, 20 k reserved holds); the
# MATERIALIZED CTE is what keeps it from doing so (bench/scale.py, docs/performance.md).
_MONEY_AT_RISK_SQL = f"""
WITH unknown AS MATERIALIZED (
    SELECT id FROM {PaymentOperation._meta.db_table} WHERE outcome = %s)
SELECT h.currency, c.name, SUM(h.amount) AS total, COUNT(*) AS n
FROM {Hold._meta.db_table} h
JOIN unknown ON h.operation_id = unknown.id
JOIN {ApiClient._meta.db_table} c ON c.id = h.api_client_id
WHERE h.state = %s
GROUP BY h.currency, c.name
ORDER BY h.currency ASC, total DESC
"""


def money_at_risk() -> list[Exposure]:
    """Unknown exposure: reserved holds of operations whose outcome is unknown, summed by
    currency and API client (one statement; see _MONEY_AT_RISK_SQL for why it is SQL)."""
    with connection.cursor() as cursor:
        cursor.execute(_MONEY_AT_RISK_SQL, [Outcome.UNKNOWN.value, HoldState.RESERVED.value])
        rows = cursor.fetchall()
    return [Exposure(currency, client or "", total or 0, n) for currency, client, total, n in rows]


def order_after_payment_delays(*, since: datetime) -> list[float]:
    """Seconds from the provider's success (the charge/authorization's settled_at) to the
    order row, for payments settled since `since`. The same definition as /metrics'
    verity_order_after_payment_seconds (recovery.metrics), so the dashboard and the
    alert agree."""
    settled = {
        purchase_id: at
        for purchase_id, at in PaymentOperation.objects.filter(
            kind__in=(OperationKind.CHARGE, OperationKind.AUTHORIZE),
            outcome=Outcome.SUCCEEDED,
            settled_at__gte=since,
        ).values_list("purchase_id", "settled_at")
        if at is not None  # settled_at__gte: never
    }
    if not settled:
        return []
    return [
        max(0.0, (created - settled[pid]).total_seconds())
        for pid, created in Order.objects.filter(purchase_id__in=list(settled)).values_list(
            "purchase_id", "created_at"
        )
    ]


def _percentile(ordered: list[float], p: float) -> float:
    # Nearest-rank percentile: an observed value, never an interpolation between two.
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[k]


def success_to_order_seconds(*, days: int = 7) -> dict:
    """Percentiles of provider success -> order written over the last `days`."""
    spans = sorted(order_after_payment_delays(since=timezone.now() - timedelta(days=days)))
    if not spans:
        return {"count": 0, "median": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(spans),
        "median": median(spans),
        "p90": _percentile(spans, 90),
        "p99": _percentile(spans, 99),
        "max": spans[-1],
    }


@dataclass(frozen=True)
class WeekInterventions:
    week_start: datetime
    resolutions: int
    audited_actions: int
    incidents: int


def _counts_in_windows(
    qs: QuerySet[Any], field_name: str, windows: Mapping[str, tuple[datetime, datetime | None]]
) -> dict[str, int]:
    """{name: rows with start <= field < end} for every window, in ONE statement that reads
    only the rows of the widest window (an index range on `field_name`)."""

    def between(start, end):
        q = Q(**{f"{field_name}__gte": start})
        return q & Q(**{f"{field_name}__lt": end}) if end is not None else q

    lo = min(start for start, _ in windows.values())
    return qs.filter(**{f"{field_name}__gte": lo}).aggregate(
        **{name: Count("pk", filter=between(start, end)) for name, (start, end) in windows.items()}
    )


def manual_interventions(*, days: int = 7, weeks: int = 4) -> dict:
    """Manual resolutions and audited console actions: the last `days`, and per ISO week
    (Monday 00:00 UTC) for the last `weeks` weeks. One statement per table (filtered
    counts), not one per table and week."""

    now = timezone.now()
    since = now - timedelta(days=days)
    monday = (now - timedelta(days=now.weekday())).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    starts = [monday - timedelta(weeks=i) for i in range(weeks)]
    windows = {f"w{i}": (start, start + timedelta(weeks=1)) for i, start in enumerate(starts)}
    resolutions = _counts_in_windows(
        Resolution.objects.all(), "created_at", {**windows, "recent": (since, None)}
    )
    audited = _counts_in_windows(
        AuditEntry.objects.all(), "created_at", {**windows, "recent": (since, None)}
    )
    incidents = _counts_in_windows(Incident.objects.all(), "opened_at", windows)
    return {
        "resolutions": resolutions["recent"],
        "audited_actions": audited["recent"],
        "weeks": [
            WeekInterventions(start, resolutions[f"w{i}"], audited[f"w{i}"], incidents[f"w{i}"])
            for i, start in enumerate(starts)
        ],
    }


@dataclass(frozen=True)
class RefundFloatPanel:
    """The x402 refund account on the dashboard: refunds are sent from it,
    so finance tops it up before it runs dry (docs/runbooks/x402-refund-float.md)."""

    address: str
    tokens: float | None  # None: the chain did not answer
    low_at: float
    error: str = ""

    @property
    def low(self) -> bool:
        return self.tokens is not None and self.tokens < self.low_at


def x402_refund_float() -> RefundFloatPanel | None:
    """None when the x402 rail or its refund key is off. One eth_call (no transaction is
    open in a console read view); a chain that does not answer shows as unreadable."""
    if not (settings.X402_ENABLED and settings.X402_REFUND_PRIVATE_KEY):
        return None
    from payments.providers.x402 import refund_account_address, refund_float

    low_at = float(settings.X402_REFUND_LOW_BALANCE)
    try:
        found = refund_float()
    except Exception as exc:  # noqa: BLE001 - the dashboard must render without the chain
        return RefundFloatPanel(
            address=refund_account_address(),
            tokens=None,
            low_at=low_at,
            error=f"{type(exc).__name__}"[:80],
        )
    if found is None:
        return None
    return RefundFloatPanel(address=found.address, tokens=found.tokens, low_at=low_at)


def active_halts() -> list[WorkflowHalt]:
    return list(WorkflowHalt.objects.order_by("name"))


# --------------------------------------------------------------------------- search


@dataclass(frozen=True)
class SearchResult:
    purchases: list
    kind: str  # what the query was taken for


def _strip_step(key: str) -> str:
    # Provider keys are sent as "<key>:<step>"; support may paste either form.
    return key.split(":", 1)[0]


# Prefix matching needs this many characters: shorter prefixes match too much to be a
# search (and would scan a large slice of the index).
SEARCH_PREFIX_MIN = 3
SEARCH_LIMIT = 50


def _by_provider_references(qs, refs: set[str]):
    refs = {r for r in refs if r}
    op_ids = set(
        PaymentOperation.objects.filter(
            Q(provider_reference__in=refs) | Q(provider_charge__in=refs)
        ).values_list("pk", flat=True)
    )
    op_ids |= set(
        ProviderEvent.objects.filter(Q(object_id__in=refs) | Q(event_id__in=refs))
        .exclude(operation_id="")
        .values_list("operation_id", flat=True)
    )

    pids = set(
        LedgerEntry.objects.filter(provider_reference__in=refs).values_list(
            "purchase_id", flat=True
        )
    )
    return list(qs.filter(Q(operations__pk__in=op_ids) | Q(pk__in=pids)).distinct())


def _balance_transaction_sources(txn_id: str) -> set[str]:
    """The charge/refund behind a `txn_…` id: a settlement row that names it, else the
    provider (read-only, outside any transaction; nothing if it is unreachable)."""
    found = set(
        SettlementDiscrepancy.objects.filter(provider_reference=txn_id).values_list(
            "provider_reference", flat=True
        )
    )

    source = payment_provider(provider_for_rail(Rail.STRIPE)).balance_transaction_source(txn_id)
    if source:
        found.add(source)
    return found


def search(query: str) -> SearchResult:
    """Every reference a customer, the provider or a runbook hands a person: ids
    (`pur_`, `op_`, `ord_`), provider references (`pi_`, `ch_`, `re_`, `py_`, `evt_`,
    `txn_`), provider keys (`vk_`), a customer reference or e-mail, whole or a prefix
    (indexed: payments migration 0004)."""
    q = (query or "").strip()
    if not q:
        return SearchResult([], "empty")
    qs = Purchase.objects.order_by("-created_at")
    if q.startswith("pur_"):
        return SearchResult(list(qs.filter(pk=q)), "purchase id")
    if q.startswith("op_"):
        return SearchResult(list(qs.filter(operations__pk=q).distinct()), "operation id")
    if q.lower().startswith("ord_"):
        pids = Order.objects.filter(reference=q.lower()).values_list("purchase_id", flat=True)
        return SearchResult(list(qs.filter(pk__in=list(pids))), "order reference")
    if q.startswith("txn_"):
        return SearchResult(
            _by_provider_references(qs, _balance_transaction_sources(q)), "balance transaction"
        )
    if q.startswith(("pi_", "re_", "ch_", "py_", "evt_")):
        return SearchResult(_by_provider_references(qs, {q}), "provider reference")
    if q.startswith("vk_"):
        key = _strip_step(q)
        return SearchResult(
            list(qs.filter(operations__idempotency_key=key).distinct()), "idempotency key"
        )
    if "@" in q:
        exact = list(qs.filter(customer_email__iexact=q)[:SEARCH_LIMIT])
        if exact:
            return SearchResult(exact, "customer e-mail")
    exact = list(qs.filter(customer_reference=q)[:SEARCH_LIMIT])
    if exact:
        return SearchResult(exact, "customer reference")
    if len(q) < SEARCH_PREFIX_MIN:
        return SearchResult([], f"prefix (at least {SEARCH_PREFIX_MIN} characters)")
    # Prefix only (never "contains"): LIKE 'q%' uses the pattern-ops indexes.
    return SearchResult(
        list(
            qs.filter(Q(customer_reference__startswith=q) | Q(customer_email__istartswith=q))[
                :SEARCH_LIMIT
            ]
        ),
        "customer reference or e-mail prefix",
    )


# ------------------------------------------------------------------------- timeline


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    order: int  # tie-break inside the same instant: cause before effect
    source: str  # quote | purchase | transition | call | event | step | hold | note ...
    title: str
    detail: dict = field(default_factory=dict)
    operation_id: str = ""
    label: str = ""  # e.g. "Fault drill"
    payload: dict | None = None  # only filled for roles allowed to see it


def purchase_get(purchase_id: str) -> Purchase | None:
    return Purchase.objects.select_related("quote", "api_client").filter(pk=purchase_id).first()


def purchase_by_token(token: str) -> Purchase | None:
    return Purchase.objects.select_related("quote").filter(status_token=token).first()


def buyer_confirmation_live(purchase_id: str) -> bool:
    """An unused, unexpired "new purchase" code of this purchase went out by e-mail (a code
    whose e-mail failed does not count: the buyer may ask again)."""
    now = timezone.now()
    ttl = timedelta(seconds=settings.BUYER_CONFIRMATION_TTL_SECONDS)
    return (
        BuyerConfirmation.objects.filter(
            purchase_id=purchase_id, used_at=None, expires_at__gt=now
        ).exists()
        and EmailMessage.objects.filter(
            purchase_id=purchase_id, kind__startswith="buyer_code:", sent_at__gt=now - ttl
        ).exists()
    )


def purchase_operations(purchase: Purchase) -> list[PaymentOperation]:
    return list(
        purchase.operations.select_related(
            "requested_by_user",
            "approved_by_user",
            "requested_by_client",
            "hold",
        ).order_by("created_at", "id")
    )


def purchase_timeline(
    purchase: Purchase,
    *,
    user=None,
    ops: list[PaymentOperation] | None = None,
    steps: list[StepRun] | None = None,
) -> list[TimelineEntry]:
    """Every recorded fact about a purchase, in time order. `ops` (from
    `purchase_operations`, holds joined) and `steps` (from `purchase_steps`): what the
    purchase page already read, not read again (fewer round trips)."""
    show_payload = user is not None and can(user, Action.VIEW_REDACTED_PAYLOAD)
    if ops is None:
        ops = purchase_operations(purchase)
    op_ids = [op.pk for op in ops]
    refs = {r for op in ops for r in (op.provider_reference, op.provider_charge) if r}
    entries: list[TimelineEntry] = []
    add = entries.append

    q = purchase.quote
    add(
        TimelineEntry(
            q.created_at,
            0,
            "quote",
            f"Quote {q.id} v{q.version}",
            {"amount": _money(q.amount, q.currency), "expires_at": q.expires_at},
        )
    )
    add(
        TimelineEntry(
            purchase.created_at,
            1,
            "purchase",
            f"Purchase {purchase.id} created",
            {"customer_reference": purchase.customer_reference},
        )
    )
    for op in ops:
        add(
            TimelineEntry(
                op.created_at,
                2,
                "operation",
                f"Operation {op.id}: {op.kind} {_money(op.amount, op.currency)}",
                {"requested_by": _requester(op)},
                operation_id=op.pk,
            )
        )
    for t in OperationTransition.objects.filter(purchase=purchase).order_by("created_at", "id"):
        what = "Operation" if t.operation_id else "Purchase"
        add(
            TimelineEntry(
                t.created_at,
                3,
                "transition",
                f"{what} {t.field}: {t.source} → {t.target}",
                {"cause": t.cause, "actor": t.actor, "evidence": _safe_evidence(t.evidence)},
                operation_id=t.operation_id or "",
            )
        )
    for c in ProviderCall.objects.filter(operation_id__in=op_ids).order_by("started_at", "id"):
        add(
            TimelineEntry(
                c.started_at,
                4,
                "call",
                f"Provider {c.purpose} {c.step} (attempt {c.attempt})",
                {
                    "http_status": c.http_status,
                    "classification": c.classification,
                    "error_code": c.error_code,
                    "request_id": c.request_id,
                    "safe_fields": c.safe_fields,
                },
                operation_id=c.operation_id,
                label="Fault drill" if c.fault_drill else "",
            )
        )
    # Also events that named this purchase in their metadata but never matched (e.g.
    # quarantined before an operation could be found).
    events = ProviderEvent.objects.filter(
        Q(operation_id__in=op_ids) | Q(object_id__in=refs) | Q(purchase_id=purchase.pk)
    ).order_by("received_at", "id")
    for e in events:
        add(
            TimelineEntry(
                e.received_at,
                5,
                "event",
                f"Webhook {e.type} ({e.event_id})",
                {"result": e.result, "reason": e.result_reason, "event_pk": e.pk},
                operation_id=e.operation_id,
                payload=e.payload if show_payload else None,
            )
        )
    # The holds came with the operations (select_related): no query of their own.
    holds = [h for h in (getattr(op, "hold", None) for op in ops) if h is not None]
    for h in sorted(holds, key=lambda h: h.created_at):
        add(
            TimelineEntry(
                h.created_at,
                6,
                "hold",
                f"Hold reserved {_money(h.amount, h.currency)}",
                {"state now": h.state},
                operation_id=h.operation_id,
            )
        )
        if h.state != HoldState.RESERVED and h.updated_at:
            add(
                TimelineEntry(
                    h.updated_at, 6, "hold", f"Hold {h.state}", {}, operation_id=h.operation_id
                )
            )
    if steps is None:
        steps = purchase_steps(purchase)
    for s in steps:
        add(
            TimelineEntry(
                s.started_at or s.created_at,
                7,
                "step",
                f"Step {s.step} started",
                {"attempts": s.attempts, "external_reference": s.external_reference},
            )
        )
        if s.completed_at:
            add(
                TimelineEntry(
                    s.completed_at,
                    7,
                    "step",
                    f"Step {s.step} {s.state}",
                    {"last_error": s.last_error[:200]},
                )
            )
        elif s.state not in (StepState.PENDING, StepState.RUNNING):
            add(
                TimelineEntry(
                    s.started_at or s.created_at,
                    8,
                    "step",
                    f"Step {s.step} {s.state}",
                    {"last_error": s.last_error[:200]},
                )
            )
    for o in Order.objects.filter(purchase_id=purchase.pk):
        add(TimelineEntry(o.created_at, 8, "order", f"Order {o.reference} written", {}))
    for d in RecoveryDecision.objects.filter(purchase_id=purchase.pk).order_by("created_at"):
        add(
            TimelineEntry(
                d.created_at,
                9,
                "decision",
                f"Recovery decision: {d.decision}",
                {"detail": d.detail},
            )
        )
    for n in Note.objects.filter(purchase_id=purchase.pk).select_related("author"):
        add(
            TimelineEntry(
                n.created_at, 10, "note", f"Note by {n.author.get_username()}", {"body": n.body}
            )
        )
    for r in Resolution.objects.filter(purchase_id=purchase.pk):
        add(
            TimelineEntry(
                r.created_at,
                11,
                "resolution",
                f"Manual resolution: {r.operation_id} → {r.outcome}",
                {"actor": r.actor, "reason": r.reason},
                operation_id=r.operation_id,
            )
        )
    for a in AuditEntry.objects.filter(purchase_id=purchase.pk):
        add(
            TimelineEntry(
                a.created_at,
                12,
                "audit",
                f"Audit: {a.action} by {a.actor}",
                {
                    "reason": a.reason,
                    "target": f"{a.target_type} {a.target_id}",
                    "ip": a.ip,
                    "before": a.before,
                    "after": a.after,
                },
            )
        )
    entries.sort(key=lambda e: (e.at, e.order))
    return entries


_EVIDENCE_KEYS = {
    "status",
    "provider_status",
    "outcome",
    "reason",
    "source",
    "event",
    "event_id",
    "provider_reference",
    "http_status",
    "classification",
    "verification",
    "grade",
    "amount",
    "currency",
    "request_id",
    "call",
    "object",
    "id",
    "latest_charge",
    "payment_intent",
    "failure_code",
    "metadata",
    "quote",
    "version",
    "compensation",
    "recovery_owner",
}


def _safe_evidence(evidence) -> dict:
    # Evidence is written by the core with safe fields; keep a whitelist anyway so a
    # future field never reaches a support screen by accident.
    if not isinstance(evidence, dict):
        return {}
    return {k: v for k, v in evidence.items() if k in _EVIDENCE_KEYS}


def _requester(op: PaymentOperation) -> str:
    if (user := op.requested_by_user) is not None:
        return f"user {user.get_username()}"
    if (client := op.requested_by_client) is not None:
        return f"API client {client.name}"
    return "system" if op.is_compensation else ""


# ---------------------------------------------------------------------- next action


@dataclass(frozen=True)
class NextAction:
    owner: str
    text: str
    # The purchase's named recovery owner, only while a person is the next to act on it
    # (a resolved purchase keeps the column, but nobody owns nothing to do).
    recovery_owner: str = ""


def purchase_next_action(purchase: Purchase, ops: list[PaymentOperation]) -> NextAction:
    """Who acts next on this purchase, and what they do: payments.next_action's step (the
    one the API, MCP and the customer page read), in staff words."""
    steps = tuple(
        f"{s.step} ({s.state})"
        for s in StepRun.objects.filter(purchase_id=purchase.pk, state__in=STEP_TROUBLE)
    )
    step = staff_next_step(purchase, ops, steps_needing_decision=steps)
    return NextAction(
        staff_owner(step, purchase),
        _staff_words(step),
        recovery_owner=purchase.recovery_owner if step.owner == Owner.SUPPORT else "",
    )


def _staff_words(step: NextStep) -> str:
    op = step.operation
    ref = op.id if op is not None else ""
    s = Situation
    if step.situation == s.UNKNOWN:
        assert op is not None  # an unknown outcome is an operation's (operation_next_step)
        when = relative(op.next_reconcile_at) if op.next_reconcile_at else "soon"
        return f"Reading {ref} back from the provider (next read-back {when})."
    reason = f" ({op.reason})" if op is not None and op.reason else ""
    words = {
        s.ESCALATED: f"Reconciliation deadline passed for {ref}: an operator resolves it "
        "with evidence from the provider dashboard.",
        s.QUEUED: f"Waiting for the provider's answer on {ref}.",
        s.SENDING: f"Waiting for the provider's answer on {ref}.",
        s.AWAITING_PROVIDER: f"Waiting for the provider's answer on {ref}.",
        s.AWAITING_BUYER: f"The buyer completes authentication for {ref}.",
        s.AWAITING_APPROVAL: f"Approve or decline refund {ref} (not by its requester).",
        s.SUCCEEDED: "Nothing to do.",
        s.FAILED_RETRIED: f"{ref} failed{reason} and was retried as {step.retried_by}: "
        "follow the retry.",
        s.FAILED_UNCONFIRMED: f"{ref} was resolved failed by a person{reason}; the provider "
        "has not confirmed it: reconciliation reads it back before the "
        "buyer may pay again.",
        s.FAILED_QUOTE_GONE: f"{ref} failed{reason} and the quote has expired: the buyer "
        "starts a new purchase at the storefront.",
        s.FAILED_ATTEMPTS_EXHAUSTED: f"{ref} failed{reason}; this purchase had "
        f"{step.attempts} payment attempts, the most allowed: "
        "contact the buyer.",
        s.FAILED_INVALID: f"The provider refused {ref} as invalid{reason}: the buyer pays "
        "with another method or starts a new purchase.",
        s.FAILED_DECLINED: f"{ref} was declined{reason}: the buyer may pay again from the "
        "storefront with another payment method.",
        s.FAILED_RETRYABLE: f"{ref} failed{reason}: the buyer may pay again from the storefront.",
        s.FAILED_NOT_PAYMENT: _refused_words(op)
        if op is not None
        and (op.reason == Reason.PROVIDER_REFUSED and op.kind == OperationKind.REFUND)
        else f"{ref} failed at the provider{reason}: decide what follows.",
        s.PAYMENT_REQUIRED: "The buyer may pay from the storefront.",
        s.QUOTE_EXPIRED: "The quote expired before payment: the buyer starts a new purchase.",
        s.UNKNOWN_UNRECORDED: "The payment's outcome is unknown and no payment is recorded "
        "to read back: check the provider dashboard.",
        s.PAID: "Paid; the orchestrator is running downstream steps.",
        s.COMPLETED: "Paid and fulfilled. Nothing to do.",
        s.MANUAL_REVIEW: "Review the purchase.",
        s.REFUND_PENDING: "A refund is in progress at the provider; reconciliation follows it.",
        s.DISPUTED: "Finance answers the dispute (evidence before its deadline) in the "
        "disputes queue.",
        s.DISPUTE_WON: "The dispute was decided for the merchant. Nothing to do.",
        s.DISPUTE_LOST: "The dispute was decided for the customer. Nothing to do.",
        s.CLOSED: "Closed. Nothing to do.",
        s.EXPIRED: "Expired before payment. Nothing to do.",
        s.OVERTURNED: f"The provider's record overturned a manual resolution of {ref} (now "
        f"{op.outcome if op is not None else ''}): check what followed, then "
        "mark it reviewed.",
        s.STEPS_NEED_DECISION: f"Downstream steps need a decision: {', '.join(step.steps)}.",
    }
    return words[step.situation]


# The provider's refusal codes for a refund, in the words support repeats to a customer.
_REFUSAL_WORDS = {
    "resource_missing": "it has no record of the payment this refund would return",
    "charge_already_refunded": "the payment was already refunded in full",
    "amount_too_large": "the amount is more than what is left to refund on the payment",
    "charge_disputed": "the payment is disputed: the customer's bank holds the money",
    "charge_expired_for_refund": "the payment is too old to be refunded by card",
}


def _refused_words(op: PaymentOperation) -> str:
    """Why a refund did not happen and who acts next, in words (the code stays in the
    timeline's evidence)."""
    amount = format_money(op.amount, op.currency)
    refused = op.transitions.filter(target=Outcome.FAILED).order_by("-id").first()
    evidence = (refused.evidence or {}) if refused is not None else {}
    code = str(evidence.get("code", ""))
    if code not in _REFUSAL_WORDS and evidence.get("http_status") == 404:
        code = "resource_missing"  # a 404 names no code everywhere (localstripe's does not)
    why = _REFUSAL_WORDS.get(code, f"its answer was “{code}”" if code else "it gave no reason")
    return (
        f"The provider refused refund {op.id} of {amount}: {why}. No money moved; the "
        "customer has not been refunded. Next: support checks the payment in the "
        "provider's dashboard and tells the customer; finance can request the refund "
        "again once the cause is fixed."
    )


def operation_get(operation_id: str) -> PaymentOperation | None:
    return PaymentOperation.objects.select_related("purchase").filter(pk=operation_id).first()


def event_get(event_pk: int) -> ProviderEvent | None:
    return ProviderEvent.objects.filter(pk=event_pk).first()


def audit_recent(
    *, limit: int = 200, actor: str = "", action: str = "", target: str = ""
) -> list[AuditEntry]:
    """The newest audit rows, optionally only one person's (`actor`), one kind of action
    (`action`, whole or its start: "console." is every console action) or one target (a
    purchase, operation or incident id)."""
    qs = AuditEntry.objects.all()
    if actor:
        qs = qs.filter(actor=actor)
    if action:
        qs = qs.filter(action__startswith=action)
    if target:
        qs = qs.filter(Q(purchase_id=target) | Q(target_id=target))
    return list(qs.order_by("-created_at", "-id")[:limit])


def refundable_payment(purchase: Purchase) -> PaymentOperation | None:
    """The purchase's own succeeded payment a console refund would reverse (for showing
    the form; a duplicate is returned by its own compensation, never by this form)."""
    return purchase_own_payments(purchase).filter(outcome=Outcome.SUCCEEDED).first()


# ---------------------------------------------------------------------- runbooks


def purchase_runbook_slug(purchase: Purchase, ops: list[PaymentOperation]) -> str | None:
    """The runbook for the purchase's current state: the same precedence as the queues a
    support person would meet it in (the most urgent question first)."""
    open_ops = [op for op in ops if op.outcome not in (Outcome.SUCCEEDED, Outcome.FAILED)]
    if any(
        op.outcome == Outcome.UNKNOWN and (op.stage == Stage.ESCALATED or op.escalated_at)
        for op in open_ops
    ):
        return "escalated"
    if any(
        op.rail == Rail.X402 and op.outcome in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER)
        for op in open_ops
    ):
        return "x402-settlement"  # a transfer on a chain: read the chain, never settle again
    if any(op.outcome == Outcome.UNKNOWN for op in open_ops):
        return "unknown-operation"
    op_ids = [op.pk for op in ops]
    quarantined = quarantined_events().filter(
        Q(purchase_id=purchase.pk) | Q(operation_id__in=op_ids)
    )
    if quarantined.filter(result_reason__startswith=MISMATCH_PREFIX).exists():
        return "amount-currency-mismatch"
    if any(op.outcome == Outcome.AWAITING_APPROVAL for op in open_ops):
        return "refund-awaiting-approval"
    if (
        compensation_steps().filter(purchase_id=purchase.pk).exists()
        or compensation_operations().filter(purchase_id=purchase.pk).exists()
    ):
        return "compensation-needed"
    if paid_without_order().filter(pk=purchase.pk).exists():
        return "paid-without-order"
    if quarantined.exists():
        return "quarantined-event"
    return None


# --------------------------------------------------------------------- incidents


def incidents_open() -> list:
    return list(
        Incident.objects.filter(status=IncidentStatus.OPEN)
        .select_related("opened_by")
        .annotate(n_items=Count("items"))
        .order_by("opened_at")
    )


def incidents_recent(*, limit: int = 50) -> list:
    return list(
        Incident.objects.select_related("opened_by", "closed_by")
        .annotate(n_items=Count("items"))
        .order_by("-opened_at")[:limit]
    )


def incident_get(incident_id: int):
    return Incident.objects.select_related("opened_by", "closed_by").filter(pk=incident_id).first()


def incident_items(incident) -> list:
    """The attached items, each with its purchase's customer e-mail and amount in words
    (`customer_email`, `amount_text`): the page is read to tell customers, not by id."""
    items = list(incident.items.select_related("attached_by").order_by("attached_at", "id"))
    found = Purchase.objects.in_bulk({it.purchase_id for it in items})
    for it in items:
        p = found.get(it.purchase_id)
        it.customer_email = p.customer_email if p else ""
        it.amount_text = format_money(p.amount, p.currency) if p else ""
    return items


def incident_audit(incident) -> list[AuditEntry]:
    return list(
        AuditEntry.objects.filter(target_type="incident", target_id=str(incident.pk)).order_by(
            "created_at", "id"
        )
    )


def incidents_for_purchase(purchase_id: str) -> list:
    return list(
        Incident.objects.filter(items__purchase_id=purchase_id).distinct().order_by("-opened_at")
    )


# ------------------------------------------------------------------------- refunds


def refundable_amount(purchase: Purchase) -> int:
    """The room of the purchase's own payments (docs/console.md#refund-approval): the core's one
    definition,
    so the form never offers what the core refuses, nor refuses what it allows (a
    duplicate's compensation is the duplicate's, not the purchase's). The core checks it
    again under the purchase lock when the refund is made."""
    return purchase_refund_room(purchase)


@dataclass(frozen=True)
class RefundAmountCheck:
    amount: int | None  # minor units
    refundable: int
    typed: str
    error: str = ""


def refund_amount_check(purchase: Purchase, *, typed: str) -> RefundAmountCheck:
    """A typed major-unit amount ("10.00") -> minor units, or the reason it cannot be
    requested. Empty means everything refundable now."""
    typed = (typed or "").strip()
    refundable = refundable_amount(purchase)
    if refundable <= 0:
        return RefundAmountCheck(None, 0, typed, "Nothing is refundable on this purchase.")
    if not typed:
        return RefundAmountCheck(refundable, refundable, typed)
    try:
        amount = parse_money(typed, purchase.currency)
    except MoneyInputError as e:
        return RefundAmountCheck(None, refundable, typed, e.message)
    if amount > refundable:
        return RefundAmountCheck(
            amount,
            refundable,
            typed,
            f"{format_money(amount, purchase.currency)} is more than is refundable now "
            f"({format_money(refundable, purchase.currency)}).",
        )
    return RefundAmountCheck(amount, refundable, typed)


# ------------------------------------------------------------------- feedback


def _last_read_back(operation_id: str) -> ProviderCall | None:
    return (
        ProviderCall.objects.filter(operation_id=operation_id, purpose=CallPurpose.RECONCILE)
        .order_by("-started_at", "-id")
        .first()
    )


def _next_read_back(op: PaymentOperation) -> str:
    if op.next_reconcile_at is None:
        return ""
    # The console's one time format (support.timefmt), as on the purchase page: two
    # roundings of one moment read as two different times.
    return f" Next read-back {relative(op.next_reconcile_at)}."


def reconcile_feedback(*, before_outcome: str, op: PaymentOperation) -> tuple[int, str]:
    """What an on-demand read-back actually did, in words (never "read back" when the
    provider said nothing)."""
    what = "payment" if op.kind in PAYMENT_KINDS else op.kind
    if op.outcome != before_outcome:
        return (
            message_levels.SUCCESS,
            f"The provider's record settles it: the {what} is now {op.outcome} "
            f"(it was {before_outcome}).",
        )
    call = _last_read_back(op.pk)
    stays = f"it stays {op.outcome}.{_next_read_back(op)}"
    if call is None:
        return message_levels.WARNING, f"No read-back was made; {stays}"
    if call.classification == Classification.NOT_FOUND or call.http_status == 404:
        return (message_levels.WARNING, f"The provider has no record of this {what} yet; {stays}")
    if call.classification in (
        Classification.UNKNOWN,
        Classification.NOT_SENT,
        Classification.RETRYABLE,
    ):
        return (
            message_levels.WARNING,
            f"The provider could not be read (HTTP {call.http_status or 'no answer'}); {stays}",
        )
    return (
        message_levels.INFO,
        f"The provider answered, but its record does not settle this {what} yet; {stays}",
    )


def purchase_steps(purchase: Purchase) -> list[StepRun]:
    return list(StepRun.objects.filter(purchase_id=purchase.pk).order_by("created_at", "id"))


def refund_approve_feedback(*, op: PaymentOperation) -> tuple[int, str]:
    amount = _money(op.amount, op.currency)
    if op.outcome == Outcome.SUCCEEDED:
        return message_levels.SUCCESS, f"Refund of {amount} approved; the provider confirmed it."
    if op.outcome == Outcome.FAILED:
        call = (
            op.provider_calls.filter(purpose=CallPurpose.DISPATCH)
            .order_by("-started_at", "-id")
            .first()
        )
        answer = ", ".join(
            x
            for x in (
                f"HTTP {call.http_status}" if call is not None and call.http_status else "",
                call.error_code if call is not None else "",
            )
            if x
        )
        return (
            message_levels.ERROR,
            f"Refund of {amount} approved, but the provider refused "
            f"it ({op.reason or 'no reason given'}{': ' + answer if answer else ''}): "
            f"no money moved, and {amount} can be refunded again. Next: support tells the "
            "customer; the provider's answer is in the timeline below.",
        )
    if op.outcome == Outcome.UNKNOWN:
        return (
            message_levels.WARNING,
            f"Refund of {amount} approved and sent; the provider's "
            "answer was lost, so it is unknown and being read back. Do not send it again.",
        )
    if op.outcome == Outcome.AWAITING_PROVIDER:
        return (
            message_levels.INFO,
            f"Refund of {amount} approved and accepted by the "
            "provider; it is still processing there.",
        )
    return (
        message_levels.INFO,
        f"Refund of {amount} approved; it is {op.outcome} and will be "
        "sent by the queue (e.g. while refunds are halted).",
    )


def operation_next_actions(
    ops: list[PaymentOperation], purchase: Purchase | None = None
) -> dict[str, dict]:
    """Each operation's next action from the one presenter (payments.api.presenters), so an
    operation card never says "none" beside a purchase card naming an owner; its owner
    named as the purchase card names it (staff_owner), never "support" beside
    "payments-oncall" or "finance"."""
    out = {}
    for op in ops:
        action = operation_next_action(op)
        if purchase is not None:
            action = {**action, "owner": staff_owner(operation_next_step(op), purchase)}
        out[op.pk] = action
    return out


# ------------------------------------------------------------------------ charts

UNKNOWN_AGE_BUCKETS = [
    ("< 5 min", timedelta(minutes=5)),
    ("5–30 min", timedelta(minutes=30)),
    ("30 min–2 h", timedelta(hours=2)),
    ("2–24 h", timedelta(hours=24)),
    ("> 1 day", None),
]


def unknown_by_age() -> list[tuple[str, int]]:
    """Unknown operations (the queue's rows) counted per age bucket."""
    now = timezone.now()
    counts = {name: 0 for name, _ in UNKNOWN_AGE_BUCKETS}
    for created in unknown_operations().values_list("created_at", flat=True):
        age = now - created
        for name, limit in UNKNOWN_AGE_BUCKETS:
            if limit is None or age < limit:
                counts[name] += 1
                break
    return list(counts.items())


def _open_at(intervals: list[tuple[datetime, datetime | None]], moment: datetime) -> int:
    return sum(1 for start, end in intervals if start <= moment and (end is None or end > moment))


def _outcome_intervals(outcome: str, since: datetime) -> list[tuple[datetime, datetime | None]]:
    """When operations entered and left `outcome`, from the transition history."""
    spans: dict[str, list] = {}
    rows = (
        OperationTransition.objects.filter(field="outcome", operation__isnull=False)
        .filter(Q(source=outcome) | Q(target=outcome))
        .filter(Q(created_at__gte=since) | Q(target=outcome))
        .order_by("created_at", "id")
        .values_list("operation_id", "source", "target", "created_at")
    )
    out = []
    for op_id, source, target, at in rows:
        if target == outcome:
            spans[op_id] = [at, None]
            out.append(spans[op_id])
        elif source == outcome and op_id in spans:
            spans[op_id][1] = at
    return [(s, e) for s, e in out if e is None or e >= since]


def queue_history(*, days: int = 7) -> tuple[list[str], dict[str, list[int]]]:
    """Queue sizes at the end of each of the last `days` days (today: now), rebuilt from
    history: operation transitions (unknown, awaiting approval), discrepancy and outbox
    timestamps. Queues without a history of their own (steps, events) are not drawn."""
    now = timezone.now()
    ends = [
        (now - timedelta(days=i)).replace(hour=23, minute=59, second=59)
        for i in range(days - 1, 0, -1)
    ] + [now]
    since = ends[0] - timedelta(days=1)
    series = {
        "Unknown operations": _outcome_intervals(Outcome.UNKNOWN, since),
        "Refunds awaiting approval": _outcome_intervals(Outcome.AWAITING_APPROVAL, since),
        "Settlement discrepancies": list(
            SettlementDiscrepancy.objects.filter(
                Q(resolved_at__isnull=True) | Q(resolved_at__gte=since)
            ).values_list("created_at", "resolved_at")
        ),
        "Outbox backlog": list(
            OutboxMessage.objects.filter(
                Q(processed_at__isnull=True) | Q(processed_at__gte=since)
            ).values_list("created_at", "processed_at")
        ),
    }
    labels = [e.strftime("%a %d") if e is not now else "now" for e in ends]
    return labels, {name: [_open_at(iv, e) for e in ends] for name, iv in series.items()}


# -- storefront webhooks (events/) ------------------------------------------------------


def webhook_endpoints() -> list[dict]:
    """Endpoints with their client's name; no secret or salt ever leaves events/."""
    endpoints = event_selectors.endpoints_all()
    names = dict(
        ApiClient.objects.filter(pk__in={e.api_client_id for e in endpoints}).values_list(
            "pk", "name"
        )
    )
    return [
        {
            "id": e.id,
            "client": names.get(e.api_client_id, "?"),
            "url": e.url,
            "event_types": "ACP order events"
            if e.kind == "acp"
            else (", ".join(e.event_types) or "every type"),
            "enabled": e.enabled,
            "disabled_reason": e.disabled_reason,
            "failing_since": e.failing_since,
            "max_in_flight": e.max_in_flight,
        }
        for e in endpoints
    ]


def webhook_deliveries(*, purchase_id: str | None = None) -> list:
    return event_selectors.deliveries_of(purchase_id=purchase_id, limit=100)
