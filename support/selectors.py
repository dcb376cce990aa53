"""Read-only queries for the console: queues, search, the purchase timeline.

Reads other apps' models directly but never writes them (writes go through each app's
services). Everything returned is a safe field: no card data, no secrets; provider
event payloads are only handed out to roles with VIEW_REDACTED_PAYLOAD.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from statistics import median

from django.conf import settings
from django.contrib import messages as message_levels
from django.db.models import Count, Exists, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from payments.enums import (
    OVERTURN_CAUSE,
    PAYMENT_KINDS,
    CallPurpose,
    Classification,
    HoldState,
    OperationKind,
    Outcome,
    Owner,
    PurchaseStatus,
    Stage,
)
from payments.models import (
    BuyerConfirmation,
    Hold,
    OperationTransition,
    PaymentOperation,
    ProviderCall,
    Purchase,
)
from payments.money import MoneyInputError, format_money, parse_money
from payments.next_action import NextStep, Situation, staff_next_step
from payments.presenters import operation_next_action
from payments.services.common import purchase_own_payments, purchase_refund_room
from payments.providers.stripe import get_provider
from recovery import selectors as recovery_selectors
from recovery.models import (
    EmailMessage,
    LedgerEntry,
    Order,
    OutboxCategory,
    OutboxMessage,
    RecoveryDecision,
    SettlementDiscrepancy,
    StepRun,
    StepState,
    WorkflowHalt,
)
from support import provider_queues
from support.access import Action, can
from support.models import AuditEntry, Incident, IncidentStatus, Note, Resolution
from support.runbooks import QUEUE_RUNBOOK
from support.timefmt import relative
from webhooks.models import EventResult, ProviderEvent

# An outbox row still unprocessed this long after it became due, or retried this often,
# is "stuck" (the relay sweeps every few seconds; minutes mean something is wrong).
STUCK_OUTBOX_AFTER = timedelta(minutes=5)
STUCK_OUTBOX_ATTEMPTS = 3
QUEUE_PAGE_SIZE = 100
PAID_STATUSES = (PurchaseStatus.PAID, PurchaseStatus.FULFILLING)
STEP_TROUBLE = (StepState.FAILED, StepState.UNKNOWN, StepState.MANUAL)


# --------------------------------------------------------------------------- queues


@dataclass(frozen=True)
class QueueItem:
    since: datetime
    kind: str
    ref: str  # the id to show/link (operation, purchase, event pk, outbox id ...)
    purchase_id: str
    summary: str
    owner: str = ""
    runbook: str = ""  # slug of the runbook for this row (support.runbooks)
    anchor: str = ""  # where on the purchase page its actions are (operation id, "steps-h")
    action: str = ""  # what a person does with it, in words (the link or form says where)
    error: str = ""  # last error, for stuck outbox rows and failed steps

    @property
    def age(self) -> timedelta:
        return timezone.now() - self.since


@dataclass(frozen=True)
class QueueSpec:
    name: str
    label: str
    action: Action  # the permission needed to see this queue
    description: str


QUEUES: dict[str, QueueSpec] = {q.name: q for q in [
    QueueSpec("unknown", "Unknown operations", Action.VIEW,
              "The provider may have applied these; reconciliation is reading them back."),
    QueueSpec("paid_without_order", "Paid without order", Action.VIEW,
              "Payment verified, no order written yet."),
    QueueSpec("compensation", "Compensation needed", Action.VIEW,
              "A downstream step failed or is uncertain, or a compensation did not settle."),
    QueueSpec("held", "Held provider events", Action.VIEW,
              "Signed provider events waiting for the record they name to settle; each "
              "retry asks for a read-back of that record. Old ones need a person."),
    QueueSpec("quarantined", "Quarantined events", Action.VIEW,
              "Signed provider events that did not match their operation."),
    QueueSpec("mismatch", "Amount or currency mismatch", Action.VIEW,
              "Quarantined events whose amount, currency, purchase or account disagree "
              "with the operation they name."),
    QueueSpec("stuck_outbox", "Stuck outbox", Action.VIEW,
              "Follow-up work not processed long after it was due."),
    QueueSpec("settlement", "Settlement discrepancies", Action.VIEW_SETTLEMENT,
              "Provider balance transactions that disagree with the ledger."),
    QueueSpec("escalated", "Escalated to a recovery owner", Action.VIEW,
              "Reconciliation deadline passed; a named owner must settle these."),
    QueueSpec("refund_approval", "Refunds awaiting approval", Action.VIEW,
              "Console and API refunds waiting for a finance approver."),
    # support.provider_queues: disputes and operations made outside Verity.
    QueueSpec("disputes", "Disputes", Action.VIEW_SETTLEMENT,
              "Open disputes at the provider, the nearest evidence deadline first."),
    QueueSpec("external", "Made outside Verity", Action.VIEW,
              "Refunds, captures and cancels the provider reported that no Verity operation "
              "requested; a finance user acknowledges each one."),
    QueueSpec("overturned", "Manual resolution overturned", Action.VIEW,
              "Verified provider evidence contradicted a person's resolution; the "
              "operation now shows the provider's outcome. Check what followed."),
    QueueSpec("duplicates", "Duplicate charges", Action.VIEW,
              "A second confirmed charge on one purchase, and the linked refund or void "
              "that returns it."),
]}


def _q_unknown():
    return PaymentOperation.objects.filter(outcome=Outcome.UNKNOWN).exclude(
        stage=Stage.ESCALATED)


def _recovery_queue(name: str):
    """recovery.selectors' own queue query (unsliced), so the console, the beat jobs and
    /metrics agree on what is in a queue; None if that helper is not there."""
    fn = getattr(recovery_selectors, name, None)
    if fn is None:
        return None
    try:
        return fn(limit=None)
    except TypeError:
        return None


def _q_paid_without_order():
    qs = _recovery_queue("paid_without_order")  # with the beat job's grace period
    if qs is not None:
        return qs
    return (Purchase.objects.filter(status__in=PAID_STATUSES)
            .annotate(has_order=Exists(Order.objects.filter(purchase_id=OuterRef("pk"))))
            .filter(has_order=False))


def _q_compensation_steps():
    qs = _recovery_queue("queue_compensation_needed")
    if qs is not None:
        return qs
    return StepRun.objects.filter(state__in=STEP_TROUBLE)


def _q_compensation_ops():
    return PaymentOperation.objects.filter(
        is_compensation=True, outcome__in=[Outcome.FAILED, Outcome.UNKNOWN])


def _q_quarantined():
    return ProviderEvent.objects.filter(result=EventResult.QUARANTINED)


def _q_held():
    return ProviderEvent.objects.filter(result=EventResult.HELD)


MISMATCH_PREFIX = "mismatch"


def _q_mismatch():
    # webhooks.services quarantines with reason "mismatch" or "mismatch:<field>".
    return _q_quarantined().filter(result_reason__startswith=MISMATCH_PREFIX)


def _q_stuck_outbox(now):
    qs = _recovery_queue("queue_stuck_outbox")
    if qs is not None:
        return qs
    return OutboxMessage.objects.filter(processed_at__isnull=True).filter(
        Q(available_at__lt=now - STUCK_OUTBOX_AFTER) | Q(attempts__gte=STUCK_OUTBOX_ATTEMPTS))


def _q_settlement():
    return SettlementDiscrepancy.objects.filter(resolved_at__isnull=True)


def _q_escalated():
    return PaymentOperation.objects.filter(
        Q(stage=Stage.ESCALATED) | Q(escalated_at__isnull=False)).exclude(
        outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED])


def _q_refund_approval():
    return PaymentOperation.objects.filter(outcome=Outcome.AWAITING_APPROVAL)


def _q_overturned():
    # Open until a person marks the overturn reviewed (the operation's next owner is
    # support from the overturn until then).
    return PaymentOperation.objects.filter(
        transitions__cause=OVERTURN_CAUSE, next_action_owner=Owner.SUPPORT).distinct()


def _q_duplicates():
    return PaymentOperation.objects.filter(is_duplicate=True)


_OP_ACTION = "Reconcile now, or resolve with provider evidence"
_STEP_WORDS = {StepState.FAILED: "failed", StepState.UNKNOWN: "may or may not have happened",
               StepState.MANUAL: "waits for a person"}
_DISCREPANCY_WORDS = {"missing_locally": "In the provider's balance, not in the ledger",
                      "missing_in_ledger": "In the provider's balance, not in the ledger",
                      "missing_at_provider": "In the ledger, not in the provider's balance",
                      "amount_differs": "Amounts differ"}


def _op_summary(op: PaymentOperation) -> str:
    return f"{op.kind} {_money(op.amount, op.currency)}"


def _purchase_for_references(refs: list[str]) -> dict[str, str]:
    """provider reference (pi_/ch_/re_/py_) -> purchase id, via operations and the ledger."""
    refs = [r for r in refs if r]
    if not refs:
        return {}
    out: dict[str, str] = {}
    for ref, charge, pid in PaymentOperation.objects.filter(
            Q(provider_reference__in=refs) | Q(provider_charge__in=refs)).values_list(
            "provider_reference", "provider_charge", "purchase_id"):
        for r in (ref, charge):
            if r in refs:
                out.setdefault(r, pid)

    for ref, pid in LedgerEntry.objects.filter(provider_reference__in=refs).values_list(
            "provider_reference", "purchase_id"):
        out.setdefault(ref, pid)
    return out


def _outbox_purchase(payload) -> str:
    if not isinstance(payload, dict):
        return ""
    if payload.get("purchase"):
        return str(payload["purchase"])
    if payload.get("operation"):
        return PaymentOperation.objects.filter(pk=payload["operation"]).values_list(
            "purchase_id", flat=True).first() or ""
    if payload.get("event"):
        e = ProviderEvent.objects.filter(pk=payload["event"]).first()
        return _event_purchase(e) if e else ""
    return ""


def _outbox_label(category: int) -> str:
    try:
        return str(OutboxCategory(category).label).capitalize()
    except ValueError:
        return f"category {category}"


def discrepancy_summary(d: SettlementDiscrepancy) -> str:
    what = _DISCREPANCY_WORDS.get(d.kind, d.kind.replace("_", " ").capitalize())
    provider = (_money(d.provider_amount, d.currency) if d.provider_amount is not None
                else "no movement")
    ledger = _money(d.ledger_amount, d.currency) if d.ledger_amount is not None else "no entry"
    return f"{what} · {d.provider_reference}: provider {provider}, ledger {ledger}"


def queue_items(name: str, *, limit: int = QUEUE_PAGE_SIZE) -> list[QueueItem]:
    """Rows of one queue, oldest first."""
    now = timezone.now()
    items: list[QueueItem] = []
    if name == "unknown":
        for op in _q_unknown().select_related("purchase").order_by("created_at")[:limit]:
            items.append(QueueItem(op.created_at, "operation", op.id, op.purchase_id,
                                   f"{_op_summary(op)} · {op.reconcile_attempts} read-backs",
                                   op.purchase.recovery_owner, anchor=op.id,
                                   action=_OP_ACTION))
    elif name == "paid_without_order":
        rows = _q_paid_without_order()  # paid_at: stored on the purchase (payments/0007)
        for p in sorted(rows[: limit * 2], key=lambda p: p.paid_at or p.updated_at)[:limit]:
            items.append(QueueItem(p.paid_at or p.updated_at, "purchase", p.id, p.id,
                                   f"{p.status} {_money(p.amount, p.currency)}",
                                   p.recovery_owner, anchor="steps-h",
                                   action="Check its steps and halts; a note or a refund "
                                          "request if the order cannot be written"))
    elif name == "compensation":
        for st in _q_compensation_steps().order_by("created_at")[:limit]:
            words = _STEP_WORDS.get(st.state, st.state)
            items.append(QueueItem(st.started_at or st.created_at, "step", st.step,
                                   st.purchase_id,
                                   f"Step {st.step} {words} after {st.attempts} attempts",
                                   anchor="steps-h", error=st.last_error[:300],
                                   action="Decide: complete forward, mark handled, or refund"))
        for op in _q_compensation_ops().order_by("created_at")[:limit]:
            items.append(QueueItem(op.created_at, "operation", op.id, op.purchase_id,
                                   f"Compensating {_op_summary(op)} is {op.outcome}",
                                   anchor=op.id, action=_OP_ACTION))
        items.sort(key=lambda i: i.since)
        items = items[:limit]
    elif name == "held":
        for e in _q_held().order_by("received_at")[:limit]:
            items.append(QueueItem(e.received_at, "event", str(e.pk), _event_purchase(e),
                                   f"{e.type} · waiting: {e.result_reason or 'no reason'} · "
                                   f"{e.attempts} attempts",
                                   action="Reconcile the operation it waits for (on the "
                                          "purchase), or triage the event"))
    elif name == "quarantined":
        for e in _q_quarantined().order_by("received_at")[:limit]:
            items.append(QueueItem(e.received_at, "event", str(e.pk), _event_purchase(e),
                                   f"{e.type} · {e.result_reason or 'no reason recorded'}",
                                   action="Release or dismiss (on the event)"))
    elif name == "mismatch":
        for e in _q_mismatch().order_by("received_at")[:limit]:
            items.append(QueueItem(e.received_at, "event", str(e.pk), _event_purchase(e),
                                   f"{e.type} {e.object_id} · {e.result_reason}",
                                   action="Compare with the operation, then release or "
                                          "dismiss (on the event)"))
    elif name == "stuck_outbox":
        for m in _q_stuck_outbox(now).order_by("created_at")[:limit]:
            items.append(QueueItem(
                m.created_at, "outbox", str(m.pk), _outbox_purchase(m.payload),
                f"{_outbox_label(m.category)} · {m.attempts} attempts · next try "
                f"{relative(m.available_at, now)}", error=(m.last_error or "")[:300],
                action="Fix the cause, then retry now"))
    elif name == "settlement":
        rows = list(_q_settlement().order_by("created_at")[:limit])
        purchases = _purchase_for_references([d.provider_reference for d in rows])
        for d in rows:
            items.append(QueueItem(d.created_at, "discrepancy", str(d.pk),
                                   purchases.get(d.provider_reference, ""),
                                   discrepancy_summary(d), error=d.detail,
                                   action="Check at the provider, then acknowledge with the "
                                          "explanation"))
    elif name == "escalated":
        for op in _q_escalated().select_related("purchase").order_by("created_at")[:limit]:
            items.append(QueueItem(op.escalated_at or op.created_at, "operation", op.id,
                                   op.purchase_id, f"{_op_summary(op)} is {op.outcome}",
                                   op.purchase.recovery_owner or op.next_action_owner,
                                   anchor=op.id,
                                   action="Resolve with evidence from the provider dashboard"))
        items.sort(key=lambda i: i.since)
    elif name == "refund_approval":
        for op in _q_refund_approval().select_related("requested_by_user").order_by(
                "created_at")[:limit]:
            who = op.requested_by_user.get_username() if op.requested_by_user else "API client"
            items.append(QueueItem(op.created_at, "operation", op.id, op.purchase_id,
                                   f"refund {_money(op.amount, op.currency)} requested by "
                                   f"{who}", "finance", anchor=op.id,
                                   action="Approve (a finance user other than the requester)"))
    elif name == "overturned":
        for op in _q_overturned().order_by("settled_at")[:limit]:
            row = op.transitions.filter(cause=OVERTURN_CAUSE).order_by("-created_at").first()
            was = ((row.evidence or {}).get("overturned") or {}) if row else {}
            items.append(QueueItem(row.created_at if row else op.updated_at, "operation",
                                   op.id, op.purchase_id,
                                   f"{op.kind} resolved {was.get('outcome', '?')} by "
                                   f"{was.get('actor') or 'a person'}; the provider shows "
                                   f"{op.outcome}", "support"))
    elif name == "duplicates":
        for op in _q_duplicates().order_by("settled_at")[:limit]:
            comp = (PaymentOperation.objects.filter(parent=op, is_compensation=True)
                    .order_by("-created_at").first())
            state = f"{comp.kind} {comp.id} is {comp.outcome}" if comp else "no refund yet"
            items.append(QueueItem(op.settled_at or op.created_at, "operation", op.id,
                                   op.purchase_id, f"duplicate {op.kind} "
                                   f"{_money(op.amount, op.currency)} · {state}",
                                   "support" if comp is None or comp.outcome == Outcome.FAILED
                                   else "reconciliation"))
    else:
        items = provider_queues.queue_items(name, limit=limit)  # KeyError if unknown
    return [replace(i, runbook=_item_runbook(name, i)) for i in items]


def _item_runbook(queue: str, item: QueueItem) -> str:
    if queue == "quarantined" and item.summary.split(" · ", 1)[-1].startswith(MISMATCH_PREFIX):
        return QUEUE_RUNBOOK["mismatch"]
    return QUEUE_RUNBOOK.get(queue, "")


@dataclass(frozen=True)
class QueueSummary:
    spec: QueueSpec
    count: int
    oldest: datetime | None

    @property
    def oldest_age(self) -> timedelta | None:
        return timezone.now() - self.oldest if self.oldest else None

    @property
    def count_label(self) -> str:  # "1 000+" past support.counts.COUNT_CAP
        from .counts import count_label

        return count_label(self.count)

    @property
    def runbook(self) -> str:
        return QUEUE_RUNBOOK.get(self.spec.name, "")


def queue_summaries(user) -> list[QueueSummary]:
    """Count and oldest age per queue the user may see (one aggregate query each)."""
    now = timezone.now()
    out = []
    for spec in QUEUES.values():
        if not can(user, spec.action):
            continue
        count, oldest = _count_oldest(spec.name, now)
        out.append(QueueSummary(spec, count, oldest))
    return out


def _agg(qs, field_name):
    # Capped count and one indexed ORDER BY … LIMIT 1 (support.counts), not COUNT/MIN over
    # the whole queue: a landing page must not pay for a long queue.
    from .counts import capped_count_oldest

    return capped_count_oldest(qs, field_name)


def _count_oldest(name: str, now) -> tuple[int, datetime | None]:
    if name == "unknown":
        return _agg(_q_unknown(), "created_at")
    if name == "paid_without_order":
        from .counts import capped_count_oldest, oldest

        qs = _q_paid_without_order()
        n, paid = capped_count_oldest(qs, "paid_at")
        return n, paid or (oldest(qs, "updated_at") if n else None)
    if name == "compensation":
        n1, o1 = _agg(_q_compensation_steps(), "created_at")
        n2, o2 = _agg(_q_compensation_ops(), "created_at")
        return n1 + n2, min([o for o in (o1, o2) if o], default=None)
    if name == "held":
        return _agg(_q_held(), "received_at")
    if name == "quarantined":
        return _agg(_q_quarantined(), "received_at")
    if name == "mismatch":
        return _agg(_q_mismatch(), "received_at")
    if name == "stuck_outbox":
        return _agg(_q_stuck_outbox(now), "created_at")
    if name == "settlement":
        return _agg(_q_settlement(), "created_at")
    if name == "escalated":
        return _agg(_q_escalated(), "created_at")
    if name == "refund_approval":
        return _agg(_q_refund_approval(), "created_at")
    if name == "overturned":
        return _agg(_q_overturned(), "settled_at")
    if name == "duplicates":
        return _agg(_q_duplicates(), "settled_at")
    return provider_queues.count_oldest(name)  # KeyError if unknown


def _event_purchase(event: ProviderEvent) -> str:
    if event.purchase_id:
        return event.purchase_id
    if event.operation_id:
        return PaymentOperation.objects.filter(pk=event.operation_id).values_list(
            "purchase_id", flat=True).first() or ""
    return ""


def _money(amount: int | None, currency: str) -> str:
    return format_money(amount, currency)


# ------------------------------------------------------------------------ dashboard


@dataclass(frozen=True)
class Exposure:
    currency: str
    client: str
    amount: int
    operations: int


def money_at_risk() -> list[Exposure]:
    """Unknown exposure: reserved holds of operations whose outcome is unknown."""
    rows = (Hold.objects.filter(state=HoldState.RESERVED, operation__outcome=Outcome.UNKNOWN)
            .values("currency", "api_client__name")
            .annotate(total=Sum("amount"), n=Count("pk")).order_by("currency", "-total"))
    return [Exposure(r["currency"], r["api_client__name"] or "", r["total"] or 0, r["n"])
            for r in rows]


def order_after_payment_delays(*, since: datetime) -> list[float]:
    """Seconds from the provider's success (the charge/authorization's settled_at) to the
    order row, for payments settled since `since`. The same definition as /metrics'
    verity_order_after_payment_seconds (recovery.metrics), so the dashboard and the
    alert agree."""
    settled = dict(PaymentOperation.objects.filter(
        kind__in=(OperationKind.CHARGE, OperationKind.AUTHORIZE), outcome=Outcome.SUCCEEDED,
        settled_at__gte=since).values_list("purchase_id", "settled_at"))
    if not settled:
        return []
    return [max(0.0, (created - settled[pid]).total_seconds())
            for pid, created in Order.objects.filter(purchase_id__in=list(settled))
            .values_list("purchase_id", "created_at")]


def _percentile(ordered: list[float], p: float) -> float:
    # Nearest-rank percentile: an observed value, never an interpolation between two.
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[k]


def success_to_order_seconds(*, days: int = 7) -> dict:
    """Percentiles of provider success -> order written over the last `days`."""
    spans = sorted(order_after_payment_delays(since=timezone.now() - timedelta(days=days)))
    if not spans:
        return {"count": 0, "median": None, "p90": None, "p99": None, "max": None}
    return {"count": len(spans), "median": median(spans), "p90": _percentile(spans, 90),
            "p99": _percentile(spans, 99), "max": spans[-1]}


@dataclass(frozen=True)
class WeekInterventions:
    week_start: datetime
    resolutions: int
    audited_actions: int
    incidents: int


def manual_interventions(*, days: int = 7, weeks: int = 4) -> dict:
    """Manual resolutions and audited console actions: the last `days`, and per ISO week
    (Monday 00:00 UTC) for the last `weeks` weeks."""

    now = timezone.now()
    since = now - timedelta(days=days)
    monday = (now - timedelta(days=now.weekday())).replace(hour=0, minute=0, second=0,
                                                           microsecond=0)
    per_week = []
    for i in range(weeks):
        start = monday - timedelta(weeks=i)
        end = start + timedelta(weeks=1)
        per_week.append(WeekInterventions(
            start,
            Resolution.objects.filter(created_at__gte=start, created_at__lt=end).count(),
            AuditEntry.objects.filter(created_at__gte=start, created_at__lt=end).count(),
            Incident.objects.filter(opened_at__gte=start, opened_at__lt=end).count()))
    return {
        "resolutions": Resolution.objects.filter(created_at__gte=since).count(),
        "audited_actions": AuditEntry.objects.filter(created_at__gte=since).count(),
        "weeks": per_week,
    }


@dataclass(frozen=True)
class RefundFloatPanel:
    """The x402 refund account on the dashboard (issue 31 #4): refunds are sent from it,
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
        return RefundFloatPanel(address=refund_account_address(), tokens=None, low_at=low_at,
                                error=f"{type(exc).__name__}"[:80])
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
    op_ids = set(PaymentOperation.objects.filter(
        Q(provider_reference__in=refs) | Q(provider_charge__in=refs)).values_list("pk", flat=True))
    op_ids |= set(ProviderEvent.objects.filter(Q(object_id__in=refs) | Q(event_id__in=refs))
                  .exclude(operation_id="").values_list("operation_id", flat=True))

    pids = set(LedgerEntry.objects.filter(provider_reference__in=refs)
               .values_list("purchase_id", flat=True))
    return list(qs.filter(Q(operations__pk__in=op_ids) | Q(pk__in=pids)).distinct())


def _balance_transaction_sources(txn_id: str) -> set[str]:
    """The charge/refund behind a `txn_…` id: a settlement row that names it, else the
    provider (read-only, outside any transaction; nothing if it is unreachable)."""
    found = set(SettlementDiscrepancy.objects.filter(provider_reference=txn_id)
                .values_list("provider_reference", flat=True))

    source = get_provider().balance_transaction_source(txn_id)
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
        return SearchResult(_by_provider_references(qs, _balance_transaction_sources(q)),
                            "balance transaction")
    if q.startswith(("pi_", "re_", "ch_", "py_", "evt_")):
        return SearchResult(_by_provider_references(qs, {q}), "provider reference")
    if q.startswith("vk_"):
        key = _strip_step(q)
        return SearchResult(list(qs.filter(operations__idempotency_key=key).distinct()),
                            "idempotency key")
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
    return SearchResult(list(qs.filter(Q(customer_reference__startswith=q)
                                       | Q(customer_email__istartswith=q))[:SEARCH_LIMIT]),
                        "customer reference or e-mail prefix")


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
    return (BuyerConfirmation.objects.filter(purchase_id=purchase_id, used_at=None,
                                             expires_at__gt=now).exists()
            and EmailMessage.objects.filter(purchase_id=purchase_id,
                                            kind__startswith="buyer_code:",
                                            sent_at__gt=now - ttl).exists())


def purchase_operations(purchase: Purchase) -> list[PaymentOperation]:
    return list(purchase.operations.select_related(
        "requested_by_user", "approved_by_user", "requested_by_client", "hold",
    ).order_by("created_at", "id"))


def purchase_timeline(purchase: Purchase, *, user=None,
                      ops: list[PaymentOperation] | None = None,
                      steps: list[StepRun] | None = None) -> list[TimelineEntry]:
    """Every recorded fact about a purchase, in time order. `ops` (from
    `purchase_operations`, holds joined) and `steps` (from `purchase_steps`): what the
    purchase page already read, not read again (issue 18: fewer round trips)."""
    show_payload = user is not None and can(user, Action.VIEW_REDACTED_PAYLOAD)
    if ops is None:
        ops = purchase_operations(purchase)
    op_ids = [op.pk for op in ops]
    refs = {r for op in ops for r in (op.provider_reference, op.provider_charge) if r}
    entries: list[TimelineEntry] = []
    add = entries.append

    q = purchase.quote
    add(TimelineEntry(q.created_at, 0, "quote", f"Quote {q.id} v{q.version}",
                      {"amount": _money(q.amount, q.currency), "expires_at": q.expires_at}))
    add(TimelineEntry(purchase.created_at, 1, "purchase", f"Purchase {purchase.id} created",
                      {"customer_reference": purchase.customer_reference}))
    for op in ops:
        add(TimelineEntry(op.created_at, 2, "operation",
                          f"Operation {op.id}: {op.kind} {_money(op.amount, op.currency)}",
                          {"requested_by": _requester(op)}, operation_id=op.pk))
    for t in OperationTransition.objects.filter(purchase=purchase).order_by("created_at", "id"):
        what = "Operation" if t.operation_id else "Purchase"
        add(TimelineEntry(t.created_at, 3, "transition",
                          f"{what} {t.field}: {t.source} → {t.target}",
                          {"cause": t.cause, "actor": t.actor,
                           "evidence": _safe_evidence(t.evidence)},
                          operation_id=t.operation_id or ""))
    for c in ProviderCall.objects.filter(operation_id__in=op_ids).order_by("started_at", "id"):
        add(TimelineEntry(c.started_at, 4, "call",
                          f"Provider {c.purpose} {c.step} (attempt {c.attempt})",
                          {"http_status": c.http_status, "classification": c.classification,
                           "error_code": c.error_code, "request_id": c.request_id,
                           "safe_fields": c.safe_fields},
                          operation_id=c.operation_id,
                          label="Fault drill" if c.fault_drill else ""))
    # Also events that named this purchase in their metadata but never matched (e.g.
    # quarantined before an operation could be found).
    events = ProviderEvent.objects.filter(
        Q(operation_id__in=op_ids) | Q(object_id__in=refs) | Q(purchase_id=purchase.pk)
    ).order_by("received_at", "id")
    for e in events:
        add(TimelineEntry(e.received_at, 5, "event", f"Webhook {e.type} ({e.event_id})",
                          {"result": e.result, "reason": e.result_reason, "event_pk": e.pk},
                          operation_id=e.operation_id,
                          payload=e.payload if show_payload else None))
    # The holds came with the operations (select_related): no query of their own.
    holds = [h for h in (getattr(op, "hold", None) for op in ops) if h is not None]
    for h in sorted(holds, key=lambda h: h.created_at):
        add(TimelineEntry(h.created_at, 6, "hold",
                          f"Hold reserved {_money(h.amount, h.currency)}",
                          {"state now": h.state}, operation_id=h.operation_id))
        if h.state != HoldState.RESERVED and h.updated_at:
            add(TimelineEntry(h.updated_at, 6, "hold", f"Hold {h.state}", {},
                              operation_id=h.operation_id))
    if steps is None:
        steps = purchase_steps(purchase)
    for s in steps:
        add(TimelineEntry(s.started_at or s.created_at, 7, "step", f"Step {s.step} started",
                          {"attempts": s.attempts,
                           "external_reference": s.external_reference}))
        if s.completed_at:
            add(TimelineEntry(s.completed_at, 7, "step", f"Step {s.step} {s.state}",
                              {"last_error": s.last_error[:200]}))
        elif s.state not in (StepState.PENDING, StepState.RUNNING):
            add(TimelineEntry(s.started_at or s.created_at, 8, "step",
                              f"Step {s.step} {s.state}", {"last_error": s.last_error[:200]}))
    for o in Order.objects.filter(purchase_id=purchase.pk):
        add(TimelineEntry(o.created_at, 8, "order", f"Order {o.reference} written", {}))
    for d in RecoveryDecision.objects.filter(purchase_id=purchase.pk).order_by("created_at"):
        add(TimelineEntry(d.created_at, 9, "decision", f"Recovery decision: {d.decision}",
                          {"detail": d.detail}))
    for n in Note.objects.filter(purchase_id=purchase.pk).select_related("author"):
        add(TimelineEntry(n.created_at, 10, "note", f"Note by {n.author.get_username()}",
                          {"body": n.body}))
    for r in Resolution.objects.filter(purchase_id=purchase.pk):
        add(TimelineEntry(r.created_at, 11, "resolution",
                          f"Manual resolution: {r.operation_id} → {r.outcome}",
                          {"actor": r.actor, "reason": r.reason}, operation_id=r.operation_id))
    for a in AuditEntry.objects.filter(purchase_id=purchase.pk):
        add(TimelineEntry(a.created_at, 12, "audit", f"Audit: {a.action} by {a.actor}",
                          {"reason": a.reason, "target": f"{a.target_type} {a.target_id}",
                           "ip": a.ip, "before": a.before, "after": a.after}))
    entries.sort(key=lambda e: (e.at, e.order))
    return entries


_EVIDENCE_KEYS = {"status", "provider_status", "outcome", "reason", "source", "event",
                  "event_id", "provider_reference", "http_status", "classification",
                  "verification", "grade", "amount", "currency", "request_id", "call",
                  "object", "id", "latest_charge", "payment_intent", "failure_code",
                  "metadata", "quote", "version", "compensation", "recovery_owner"}


def _safe_evidence(evidence) -> dict:
    # Evidence is written by the core with safe fields; keep a whitelist anyway so a
    # future field never reaches a support screen by accident.
    if not isinstance(evidence, dict):
        return {}
    return {k: v for k, v in evidence.items() if k in _EVIDENCE_KEYS}


def _requester(op: PaymentOperation) -> str:
    if op.requested_by_user_id:
        return f"user {op.requested_by_user.get_username()}"
    if op.requested_by_client_id:
        return f"API client {op.requested_by_client.name}"
    return "system" if op.is_compensation else ""


# ---------------------------------------------------------------------- next action


@dataclass(frozen=True)
class NextAction:
    owner: str
    text: str


def purchase_next_action(purchase: Purchase, ops: list[PaymentOperation]) -> NextAction:
    """Who acts next on this purchase, and what they do: payments.next_action's step (the
    one the API, MCP and the customer page read), in staff words."""
    steps = tuple(f"{s.step} ({s.state})" for s in StepRun.objects.filter(
        purchase_id=purchase.pk, state__in=STEP_TROUBLE))
    step = staff_next_step(purchase, ops, steps_needing_decision=steps)
    owner = str(step.owner)
    if step.situation == Situation.AWAITING_APPROVAL:
        owner = "finance"  # a renaming: finance is the support role that approves refunds
    elif step.owner == Owner.SUPPORT and purchase.recovery_owner:
        owner = purchase.recovery_owner  # the person support assigned
    return NextAction(owner, _staff_words(step))


def _staff_words(step: NextStep) -> str:
    op = step.operation
    ref = op.id if op is not None else ""
    s = Situation
    if step.situation == s.UNKNOWN:
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
        s.AWAITING_APPROVAL: f"Approve or leave refund {ref} (not by its requester).",
        s.SUCCEEDED: "Nothing to do.",
        s.FAILED_RETRIED: f"{ref} failed{reason} and was retried as {step.retried_by}: "
                          "follow the retry.",
        s.FAILED_QUOTE_GONE: f"{ref} failed{reason} and the quote has expired: the buyer "
                             "starts a new purchase at the storefront.",
        s.FAILED_ATTEMPTS_EXHAUSTED: f"{ref} failed{reason}; this purchase had "
                                     f"{step.attempts} payment attempts, the most allowed: "
                                     "contact the buyer.",
        s.FAILED_INVALID: f"The provider refused {ref} as invalid{reason}: the buyer pays "
                          "with another method or starts a new purchase.",
        s.FAILED_DECLINED: f"{ref} was declined{reason}: the buyer may pay again from the "
                           "storefront with another payment method.",
        s.FAILED_RETRYABLE: f"{ref} failed{reason}: the buyer may pay again from the "
                            "storefront.",
        s.FAILED_NOT_PAYMENT: f"{ref} failed at the provider{reason}: decide what follows.",
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


def operation_get(operation_id: str) -> PaymentOperation | None:
    return PaymentOperation.objects.select_related("purchase").filter(pk=operation_id).first()


def event_get(event_pk: int) -> ProviderEvent | None:
    return ProviderEvent.objects.filter(pk=event_pk).first()


def audit_recent(*, limit: int = 200) -> list[AuditEntry]:
    return list(AuditEntry.objects.order_by("-created_at", "-id")[:limit])


def refundable_payment(purchase: Purchase) -> PaymentOperation | None:
    """The purchase's own succeeded payment a console refund would reverse (for showing
    the form; a duplicate is returned by its own compensation, never by this form)."""
    return purchase_own_payments(purchase).filter(outcome=Outcome.SUCCEEDED).first()



# ---------------------------------------------------------------------- runbooks


def purchase_runbook_slug(purchase: Purchase, ops: list[PaymentOperation]) -> str | None:
    """The runbook for the purchase's current state: the same precedence as the queues a
    support person would meet it in (the most urgent question first)."""
    open_ops = [op for op in ops if op.outcome not in (Outcome.SUCCEEDED, Outcome.FAILED)]
    if any(op.outcome == Outcome.UNKNOWN and (op.stage == Stage.ESCALATED or op.escalated_at)
           for op in open_ops):
        return "escalated"
    if any(op.rail == "x402" and op.outcome in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER)
           for op in open_ops):
        return "x402-settlement"  # a transfer on a chain: read the chain, never settle again
    if any(op.outcome == Outcome.UNKNOWN for op in open_ops):
        return "unknown-operation"
    op_ids = [op.pk for op in ops]
    quarantined = _q_quarantined().filter(Q(purchase_id=purchase.pk)
                                          | Q(operation_id__in=op_ids))
    if quarantined.filter(result_reason__startswith=MISMATCH_PREFIX).exists():
        return "amount-currency-mismatch"
    if any(op.outcome == Outcome.AWAITING_APPROVAL for op in open_ops):
        return "refund-awaiting-approval"
    if (_q_compensation_steps().filter(purchase_id=purchase.pk).exists()
            or _q_compensation_ops().filter(purchase_id=purchase.pk).exists()):
        return "compensation-needed"
    if _q_paid_without_order().filter(pk=purchase.pk).exists():
        return "paid-without-order"
    if quarantined.exists():
        return "quarantined-event"
    return None


# --------------------------------------------------------------------- incidents


def incidents_open() -> list:
    return list(Incident.objects.filter(status=IncidentStatus.OPEN)
                .select_related("opened_by").annotate(n_items=Count("items"))
                .order_by("opened_at"))


def incidents_recent(*, limit: int = 50) -> list:
    return list(Incident.objects.select_related("opened_by", "closed_by")
                .annotate(n_items=Count("items")).order_by("-opened_at")[:limit])


def incident_get(incident_id: int):
    return Incident.objects.select_related("opened_by", "closed_by").filter(
        pk=incident_id).first()


def incident_items(incident) -> list:
    return list(incident.items.select_related("attached_by").order_by("attached_at", "id"))


def incident_audit(incident) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(target_type="incident", target_id=str(incident.pk))
                .order_by("created_at", "id"))


def incidents_for_purchase(purchase_id: str) -> list:
    return list(Incident.objects.filter(items__purchase_id=purchase_id).distinct()
                .order_by("-opened_at"))


# ------------------------------------------------------------------------- refunds


def refundable_amount(purchase: Purchase) -> int:
    """The room of the purchase's own payments (DESIGN §10.8): the core's one definition,
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
            amount, refundable, typed,
            f"{format_money(amount, purchase.currency)} is more than is refundable now "
            f"({format_money(refundable, purchase.currency)}).")
    return RefundAmountCheck(amount, refundable, typed)


# ------------------------------------------------------------------- feedback


def _last_read_back(operation_id: str) -> ProviderCall | None:
    return (ProviderCall.objects.filter(operation_id=operation_id,
                                        purpose=CallPurpose.RECONCILE)
            .order_by("-started_at", "-id").first())


def _next_read_back(op: PaymentOperation) -> str:
    if op.next_reconcile_at is None:
        return ""
    minutes = max(1, round((op.next_reconcile_at - timezone.now()).total_seconds() / 60))
    return f" Next read-back in {minutes} min."


def reconcile_feedback(*, before_outcome: str, op: PaymentOperation) -> tuple[int, str]:
    """What an on-demand read-back actually did, in words (never "read back" when the
    provider said nothing)."""
    what = "payment" if op.kind in PAYMENT_KINDS else op.kind
    if op.outcome != before_outcome:
        return (message_levels.SUCCESS,
                f"The provider's record settles it: the {what} is now {op.outcome} "
                f"(it was {before_outcome}).")
    call = _last_read_back(op.pk)
    stays = f"it stays {op.outcome}.{_next_read_back(op)}"
    if call is None:
        return message_levels.WARNING, f"No read-back was made; {stays}"
    if call.classification == Classification.NOT_FOUND or call.http_status == 404:
        return (message_levels.WARNING,
                f"The provider has no record of this {what} yet; {stays}")
    if call.classification in (Classification.UNKNOWN, Classification.NOT_SENT,
                               Classification.RETRYABLE):
        return (message_levels.WARNING,
                f"The provider could not be read (HTTP {call.http_status or 'no answer'}); "
                f"{stays}")
    return (message_levels.INFO,
            f"The provider answered, but its record does not settle this {what} yet; {stays}")


def purchase_steps(purchase: Purchase) -> list[StepRun]:
    return list(StepRun.objects.filter(purchase_id=purchase.pk).order_by("created_at", "id"))


def refund_approve_feedback(*, op: PaymentOperation) -> tuple[int, str]:
    amount = _money(op.amount, op.currency)
    if op.outcome == Outcome.SUCCEEDED:
        return message_levels.SUCCESS, f"Refund of {amount} approved; the provider confirmed it."
    if op.outcome == Outcome.FAILED:
        return (message_levels.ERROR, f"Refund of {amount} approved, but the provider refused "
                f"it ({op.reason or 'no reason given'}); no money moved.")
    if op.outcome == Outcome.UNKNOWN:
        return (message_levels.WARNING, f"Refund of {amount} approved and sent; the provider's "
                "answer was lost, so it is unknown and being read back. Do not send it again.")
    if op.outcome == Outcome.AWAITING_PROVIDER:
        return (message_levels.INFO, f"Refund of {amount} approved and accepted by the "
                "provider; it is still processing there.")
    return (message_levels.INFO, f"Refund of {amount} approved; it is {op.outcome} and will be "
            "sent by the queue (e.g. while refunds are halted).")


def operation_next_actions(ops: list[PaymentOperation]) -> dict[str, dict]:
    """Each operation's next action from the one presenter (payments.presenters), so an
    operation card never says "none" beside a purchase card naming an owner."""
    return {op.pk: operation_next_action(op) for op in ops}


# ------------------------------------------------------------------------ charts

UNKNOWN_AGE_BUCKETS = [("< 5 min", timedelta(minutes=5)), ("5–30 min", timedelta(minutes=30)),
                       ("30 min–2 h", timedelta(hours=2)), ("2–24 h", timedelta(hours=24)),
                       ("> 1 day", None)]


def unknown_by_age() -> list[tuple[str, int]]:
    """Unknown operations (the queue's rows) counted per age bucket."""
    now = timezone.now()
    counts = {name: 0 for name, _ in UNKNOWN_AGE_BUCKETS}
    for created in _q_unknown().values_list("created_at", flat=True):
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
    rows = (OperationTransition.objects.filter(field="outcome", operation__isnull=False)
            .filter(Q(source=outcome) | Q(target=outcome))
            .filter(Q(created_at__gte=since) | Q(target=outcome))
            .order_by("created_at", "id").values_list("operation_id", "source", "target",
                                                      "created_at"))
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
    ends = [(now - timedelta(days=i)).replace(hour=23, minute=59, second=59)
            for i in range(days - 1, 0, -1)] + [now]
    since = ends[0] - timedelta(days=1)
    series = {
        "Unknown operations": _outcome_intervals(Outcome.UNKNOWN, since),
        "Refunds awaiting approval": _outcome_intervals(Outcome.AWAITING_APPROVAL, since),
        "Settlement discrepancies": list(SettlementDiscrepancy.objects.filter(
            Q(resolved_at__isnull=True) | Q(resolved_at__gte=since))
            .values_list("created_at", "resolved_at")),
        "Outbox backlog": list(OutboxMessage.objects.filter(
            Q(processed_at__isnull=True) | Q(processed_at__gte=since))
            .values_list("created_at", "processed_at")),
    }
    labels = [e.strftime("%a %d") if e is not now else "now" for e in ends]
    return labels, {name: [_open_at(iv, e) for e in ends] for name, iv in series.items()}
