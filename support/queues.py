"""The console's queues: one `QueueSpec` per queue, registered in `QUEUES`.

A queue is its rows (one or more query sets), the field its age is read from, how a row
reads to a person, the permission needed to see it, its page template and its runbook. All
of that is declared once here; the landing page's counts, the queue page's rows and the
runbook links read the registry (support.selectors re-exports it). A queue without a
runbook is refused when this module is imported: a person who meets a row must be able to
find what to do with it.

Counts are capped (support.counts): a landing page must not pay for a long queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from payments.enums import OVERTURN_CAUSE, Outcome, Owner, PurchaseStatus, Stage
from payments.models import OperationTransition, PaymentOperation, Purchase
from payments.money import format_money
from payments.next_action import operation_next_step, purchase_next_step
from recovery import selectors as recovery_selectors
from recovery.models import (
    LedgerEntry,
    Order,
    OutboxCategory,
    OutboxMessage,
    SettlementDiscrepancy,
    StepRun,
    StepState,
)
from support import provider_queues
from support.access import Action, can
from support.counts import capped_count_oldest, capped_counts_oldest, count_label, oldest
from support.owners import staff_owner
from support.timefmt import relative
from webhooks.models import EventResult, ProviderEvent

# An outbox row still unprocessed this long after it became due, or retried this often,
# is "stuck" (the relay sweeps every few seconds; minutes mean something is wrong).
STUCK_OUTBOX_AFTER = timedelta(minutes=5)
STUCK_OUTBOX_ATTEMPTS = 3
QUEUE_PAGE_SIZE = 100
PAID_STATUSES = (PurchaseStatus.PAID, PurchaseStatus.FULFILLING)
STEP_TROUBLE = (StepState.FAILED, StepState.UNKNOWN, StepState.MANUAL)
MISMATCH_PREFIX = "mismatch"  # webhooks quarantines with "mismatch" or "mismatch:<field>"
DEFAULT_TEMPLATE = "console/queue.html"
RUNBOOK_DIR = Path(settings.BASE_DIR) / "docs" / "runbooks"  # support.runbooks renders them


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
    customer_email: str = ""  # whom to call back (filled for every row, one read a page)

    @property
    def age(self) -> timedelta:
        return timezone.now() - self.since


Rows = Callable[[list[Any], datetime], list[Any]]  # (fetched objects, now) -> items


def each(row: Callable[[Any, datetime], Any]) -> Rows:
    """Rows rendered one object at a time."""
    return lambda objects, now: [row(obj, now) for obj in objects]


@dataclass(frozen=True)
class QueuePart:
    """One query set of a queue: its rows (unsliced), the field its age is read from, the
    order its rows are listed in (default: the age field) and how they read."""

    queryset: Callable[[datetime], QuerySet]
    age_field: str
    rows: Rows
    order_by: tuple[str, ...] = ()
    related: tuple[str, ...] = ()
    # Overrides for a part whose rows or count do not follow from the above.
    fetch: Callable[[QuerySet, int], Iterable[Any]] | None = None
    count: Callable[[QuerySet], tuple[int, datetime | None]] | None = None
    # Where rows are counted but none has the age field, the oldest is read from this one.
    oldest_fallback: str = ""
    # Counted in a statement of its own, not in the landing page's UNION ALL: a part whose
    # plan PostgreSQL estimates as costly (above jit_above_cost) makes it JIT-compile the
    # whole statement it is in, every branch of the UNION (~180 ms at 1 M purchases).
    count_alone: bool = False

    def items(self, now: datetime, limit: int) -> list[Any]:
        qs = self.queryset(now)
        if self.related:
            qs = qs.select_related(*self.related)
        fetched = (
            self.fetch(qs, limit)
            if self.fetch is not None
            else qs.order_by(*(self.order_by or (self.age_field,)))[:limit]
        )
        return self.rows(list(fetched), now)

    def count_oldest(self, now: datetime) -> tuple[int, datetime | None]:
        qs = self.queryset(now)
        if self.count is not None:
            return self.count(qs)
        return self.with_fallback(qs, capped_count_oldest(qs, self.age_field))

    def with_fallback(
        self, qs: QuerySet, counted: tuple[int, datetime | None]
    ) -> tuple[int, datetime | None]:
        n, found = counted
        if n and found is None and self.oldest_fallback:
            found = oldest(qs, self.oldest_fallback)
        return n, found


@dataclass(frozen=True)
class QueueSpec:
    name: str
    label: str
    action: Action  # the permission needed to see this queue
    description: str
    runbook: str  # slug of docs/runbooks/<slug>.md; required
    parts: tuple[QueuePart, ...]
    template: str = DEFAULT_TEMPLATE
    # Rows listed by `since` across parts (always when there is more than one part).
    sort_by_since: bool = False
    # A row's own runbook, where it differs from the queue's (a mismatch in quarantine).
    row_runbook: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        if not self.runbook:
            raise ValueError(
                f"console queue {self.name!r} has no runbook: a person who meets "
                "its rows must find what to do with them"
            )
        if not self.parts:
            raise ValueError(f"console queue {self.name!r} has no rows")

    def items(self, *, limit: int = QUEUE_PAGE_SIZE, now: datetime | None = None) -> list:
        """Rows, oldest first (or in the queue's own order), each with its runbook."""
        now = now or timezone.now()
        items = [item for part in self.parts for item in part.items(now, limit)]
        if self.sort_by_since or len(self.parts) > 1:
            items.sort(key=lambda i: i.since)
            items = items[:limit]
        emails = customer_emails([i.purchase_id for i in items])
        return [
            replace(
                i,
                runbook=self.row_runbook(i) if self.row_runbook else self.runbook,
                customer_email=emails.get(i.purchase_id, ""),
            )
            for i in items
        ]

    def count_oldest(self, now: datetime | None = None) -> tuple[int, datetime | None]:
        now = now or timezone.now()
        counted = [part.count_oldest(now) for part in self.parts]
        return (
            sum(n for n, _ in counted),
            min((o for _, o in counted if o is not None), default=None),
        )


def customer_emails(purchase_ids: list[str]) -> dict[str, str]:
    """purchase id -> the customer's e-mail, in one read for a page of queue rows (support
    calls the customer back from the queue, not after opening each purchase)."""
    ids = {pid for pid in purchase_ids if pid}
    if not ids:
        return {}
    return dict(Purchase.objects.filter(pk__in=ids).values_list("pk", "customer_email"))


QUEUES: dict[str, QueueSpec] = {}


def queue_register(spec: QueueSpec) -> QueueSpec:
    """Add a queue to the console. Refused (at import: the registry is built below) for a
    name already taken or a runbook that is not a file in docs/runbooks/."""
    if spec.name in QUEUES:
        raise ValueError(f"console queue {spec.name!r} is registered twice")
    if not (RUNBOOK_DIR / f"{spec.runbook}.md").is_file():
        raise ValueError(
            f"console queue {spec.name!r} names runbook {spec.runbook!r}, which "
            f"is not in {RUNBOOK_DIR}"
        )
    QUEUES[spec.name] = spec
    return spec


def queue_get(name: str) -> QueueSpec:
    return QUEUES[name]  # KeyError if unknown


def queue_items(name: str, *, limit: int = QUEUE_PAGE_SIZE) -> list:
    """Rows of one queue, oldest first."""
    return queue_get(name).items(limit=limit)


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
        return count_label(self.count)

    @property
    def runbook(self) -> str:
        return self.spec.runbook


def queue_summaries(user) -> list[QueueSummary]:
    """Count and oldest age per queue the user may see: every part's capped count in one
    statement (support.counts.capped_counts_oldest); a part with its own `count`, or
    `count_alone`, adds one."""
    now = timezone.now()
    specs = [spec for spec in QUEUES.values() if can(user, spec.action)]
    parts = [(spec.name, part, part.queryset(now)) for spec in specs for part in spec.parts]
    combined = [(part, qs) for _, part, qs in parts if part.count is None and not part.count_alone]
    counted = dict(
        zip(
            (id(part) for part, _ in combined),
            capped_counts_oldest([(qs, part.age_field) for part, qs in combined]),
            strict=True,
        )
    )
    per_queue: dict[str, list[tuple[int, datetime | None]]] = {}
    for name, part, qs in parts:
        if id(part) in counted:
            found = part.with_fallback(qs, counted[id(part)])
        else:
            found = part.count_oldest(now)
        per_queue.setdefault(name, []).append(found)
    return [
        QueueSummary(
            spec,
            sum(n for n, _ in per_queue[spec.name]),
            min((o for _, o in per_queue[spec.name] if o is not None), default=None),
        )
        for spec in specs
    ]


# -- the query sets (unsliced; the beat jobs and /metrics read the same ones) -------------


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


def unknown_operations(now=None):
    return PaymentOperation.objects.filter(outcome=Outcome.UNKNOWN).exclude(stage=Stage.ESCALATED)


def paid_without_order(now=None):
    qs = _recovery_queue("paid_without_order")  # with the beat job's grace period
    if qs is not None:
        return qs
    return (
        Purchase.objects.filter(status__in=PAID_STATUSES)
        .annotate(has_order=Exists(Order.objects.filter(purchase_id=OuterRef("pk"))))
        .filter(has_order=False)
    )


def compensation_steps(now=None):
    qs = _recovery_queue("queue_compensation_needed")
    if qs is not None:
        return qs
    return StepRun.objects.filter(state__in=STEP_TROUBLE)


def compensation_operations(now=None):
    return PaymentOperation.objects.filter(
        is_compensation=True, outcome__in=[Outcome.FAILED, Outcome.UNKNOWN]
    )


def quarantined_events(now=None):
    return ProviderEvent.objects.filter(result=EventResult.QUARANTINED)


def held_events(now=None):
    return ProviderEvent.objects.filter(result=EventResult.HELD)


def mismatch_events(now=None):
    return quarantined_events().filter(result_reason__startswith=MISMATCH_PREFIX)


def stuck_outbox(now=None):
    qs = _recovery_queue("queue_stuck_outbox")
    if qs is not None:
        return qs
    now = now or timezone.now()
    return OutboxMessage.objects.filter(processed_at__isnull=True).filter(
        Q(available_at__lt=now - STUCK_OUTBOX_AFTER) | Q(attempts__gte=STUCK_OUTBOX_ATTEMPTS)
    )


def open_discrepancies(now=None):
    return SettlementDiscrepancy.objects.filter(resolved_at__isnull=True)


def escalated_operations(now=None):
    return PaymentOperation.objects.filter(
        Q(stage=Stage.ESCALATED) | Q(escalated_at__isnull=False)
    ).exclude(outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED])


def refunds_awaiting_approval(now=None):
    return PaymentOperation.objects.filter(outcome=Outcome.AWAITING_APPROVAL)


def overturned_operations(now=None):
    # Open until a person marks the overturn reviewed (the operation's next owner is
    # support from the overturn until then). EXISTS, not a join plus DISTINCT: the rows
    # come from the few support-owned operations (op_support_owned_settled_idx, in
    # settled_at order), each probed for an overturn by its transitions' operation index,
    # instead of DISTINCT over every column of every operation.
    overturned = OperationTransition.objects.filter(
        operation_id=OuterRef("pk"), cause=OVERTURN_CAUSE
    )
    return PaymentOperation.objects.filter(Exists(overturned), next_action_owner=Owner.SUPPORT)


def duplicate_operations(now=None):
    return PaymentOperation.objects.filter(is_duplicate=True)


# -- how rows read ---------------------------------------------------------------------

_OP_ACTION = "Reconcile now, or resolve with provider evidence"
_STEP_WORDS = {
    StepState.FAILED: "failed",
    StepState.UNKNOWN: "may or may not have happened",
    StepState.MANUAL: "waits for a person",
}
_DISCREPANCY_WORDS = {
    "missing_locally": "In the provider's balance, not in the ledger",
    "missing_in_ledger": "In the provider's balance, not in the ledger",
    "missing_at_provider": "In the ledger, not in the provider's balance",
    "amount_differs": "Amounts differ",
}


def _money(amount: int | None, currency: str) -> str:
    return format_money(amount, currency)


def _op_summary(op: PaymentOperation) -> str:
    return f"{op.kind} {_money(op.amount, op.currency)}"


def event_purchase(event: ProviderEvent) -> str:
    if event.purchase_id:
        return event.purchase_id
    if event.operation_id:
        return (
            PaymentOperation.objects.filter(pk=event.operation_id)
            .values_list("purchase_id", flat=True)
            .first()
            or ""
        )
    return ""


def _purchase_for_references(refs: list[str]) -> dict[str, str]:
    """provider reference (pi_/ch_/re_/py_) -> purchase id, via operations and the ledger."""
    refs = [r for r in refs if r]
    if not refs:
        return {}
    out: dict[str, str] = {}
    for ref, charge, pid in PaymentOperation.objects.filter(
        Q(provider_reference__in=refs) | Q(provider_charge__in=refs)
    ).values_list("provider_reference", "provider_charge", "purchase_id"):
        for r in (ref, charge):
            if r in refs:
                out.setdefault(r, pid)

    for ref, pid in LedgerEntry.objects.filter(provider_reference__in=refs).values_list(
        "provider_reference", "purchase_id"
    ):
        out.setdefault(ref, pid)
    return out


def _outbox_purchase(payload) -> str:
    if not isinstance(payload, dict):
        return ""
    if payload.get("purchase"):
        return str(payload["purchase"])
    if payload.get("operation"):
        return (
            PaymentOperation.objects.filter(pk=payload["operation"])
            .values_list("purchase_id", flat=True)
            .first()
            or ""
        )
    if payload.get("event"):
        e = ProviderEvent.objects.filter(pk=payload["event"]).first()
        return event_purchase(e) if e else ""
    return ""


def _outbox_label(category: int) -> str:
    try:
        return str(OutboxCategory(category).label).capitalize()
    except ValueError:
        return f"category {category}"


def discrepancy_summary(d: SettlementDiscrepancy) -> str:
    what = _DISCREPANCY_WORDS.get(d.kind, d.kind.replace("_", " ").capitalize())
    provider = (
        _money(d.provider_amount, d.currency) if d.provider_amount is not None else "no movement"
    )
    ledger = _money(d.ledger_amount, d.currency) if d.ledger_amount is not None else "no entry"
    return f"{what} · {d.provider_reference}: provider {provider}, ledger {ledger}"


def _unknown_row(op, now) -> QueueItem:
    return QueueItem(
        op.created_at,
        "operation",
        op.id,
        op.purchase_id,
        f"{_op_summary(op)} · {op.reconcile_attempts} read-backs",
        staff_owner(operation_next_step(op), op.purchase),
        anchor=op.id,
        action=_OP_ACTION,
    )


def _paid_at(p) -> datetime:
    return p.paid_at or p.updated_at


def _paid_without_order_fetch(qs, limit):
    # paid_at is stored on the purchase; a row paid before it was stored reads updated_at.
    return sorted(qs[: limit * 2], key=_paid_at)[:limit]


def _paid_without_order_row(p, now) -> QueueItem:
    return QueueItem(
        _paid_at(p),
        "purchase",
        p.id,
        p.id,
        f"{p.status} {_money(p.amount, p.currency)}",
        staff_owner(purchase_next_step(p), p),
        anchor="steps-h",
        action="Check its steps and halts; a note or a refund "
        "request if the order cannot be written",
    )


def _step_row(st, now) -> QueueItem:
    words = _STEP_WORDS.get(st.state, st.state)
    return QueueItem(
        st.started_at or st.created_at,
        "step",
        st.step,
        st.purchase_id,
        f"Step {st.step} {words} after {st.attempts} attempts",
        anchor="steps-h",
        error=st.last_error[:300],
        action="Decide: complete forward, mark handled, or refund",
    )


def _compensation_op_row(op, now) -> QueueItem:
    return QueueItem(
        op.created_at,
        "operation",
        op.id,
        op.purchase_id,
        f"Compensating {_op_summary(op)} is {op.outcome}",
        anchor=op.id,
        action=_OP_ACTION,
    )


def _held_row(e, now) -> QueueItem:
    return QueueItem(
        e.received_at,
        "event",
        str(e.pk),
        event_purchase(e),
        f"{e.type} · waiting: {e.result_reason or 'no reason'} · {e.attempts} attempts",
        action="Reconcile the operation it waits for (on the purchase), or triage the event",
    )


def _quarantined_row(e, now) -> QueueItem:
    return QueueItem(
        e.received_at,
        "event",
        str(e.pk),
        event_purchase(e),
        f"{e.type} · {e.result_reason or 'no reason recorded'}",
        action="Release or dismiss (on the event)",
    )


def _mismatch_row(e, now) -> QueueItem:
    return QueueItem(
        e.received_at,
        "event",
        str(e.pk),
        event_purchase(e),
        f"{e.type} {e.object_id} · {e.result_reason}",
        action="Compare with the operation, then release or dismiss (on the event)",
    )


def _outbox_row(m, now) -> QueueItem:
    return QueueItem(
        m.created_at,
        "outbox",
        str(m.pk),
        _outbox_purchase(m.payload),
        f"{_outbox_label(m.category)} · {m.attempts} attempts · next try "
        f"{relative(m.available_at, now)}",
        error=(m.last_error or "")[:300],
        action="Fix the cause, then retry now",
    )


def _settlement_rows(rows, now) -> list[QueueItem]:
    purchases = _purchase_for_references([d.provider_reference for d in rows])  # one read
    return [
        QueueItem(
            d.created_at,
            "discrepancy",
            str(d.pk),
            purchases.get(d.provider_reference, ""),
            discrepancy_summary(d),
            error=d.detail,
            action="Check at the provider, then mark it reviewed with the explanation",
        )
        for d in rows
    ]


def _escalated_row(op, now) -> QueueItem:
    return QueueItem(
        op.escalated_at or op.created_at,
        "operation",
        op.id,
        op.purchase_id,
        f"{_op_summary(op)} is {op.outcome}",
        staff_owner(operation_next_step(op), op.purchase),
        anchor=op.id,
        action="Resolve with evidence from the provider dashboard",
    )


def _refund_approval_row(op, now) -> QueueItem:
    who = op.requested_by_user.get_username() if op.requested_by_user else "API client"
    return QueueItem(
        op.created_at,
        "operation",
        op.id,
        op.purchase_id,
        f"refund {_money(op.amount, op.currency)} requested by {who}",
        "finance",
        anchor=op.id,
        action="Approve (a finance user other than the requester)",
    )


def _overturned_row(op, now) -> QueueItem:
    row = op.transitions.filter(cause=OVERTURN_CAUSE).order_by("-created_at").first()
    was = ((row.evidence or {}).get("overturned") or {}) if row else {}
    return QueueItem(
        row.created_at if row else op.updated_at,
        "operation",
        op.id,
        op.purchase_id,
        f"{op.kind} resolved {was.get('outcome', '?')} by "
        f"{was.get('actor') or 'a person'}; the provider shows {op.outcome}",
        "support",
    )


def _x402_reversed_operations(now=None):
    from payments.services.x402_finality import x402_transfers_reversed

    return x402_transfers_reversed()


def _x402_reversed_row(op, now) -> QueueItem:
    return QueueItem(
        op.settled_at or op.updated_at,
        "operation",
        op.id,
        op.purchase_id,
        f"x402 payment {_money(op.amount, op.currency)}: its transfer left the "
        f"chain before it was final",
        "support",
        anchor=op.id,
        action="Check what followed, then mark it reviewed",
    )


def _duplicate_row(op, now) -> QueueItem:
    comp = (
        PaymentOperation.objects.filter(parent=op, is_compensation=True)
        .order_by("-created_at")
        .first()
    )
    state = f"{comp.kind} {comp.id} is {comp.outcome}" if comp else "no refund yet"
    return QueueItem(
        op.settled_at or op.created_at,
        "operation",
        op.id,
        op.purchase_id,
        f"duplicate {op.kind} {_money(op.amount, op.currency)} · {state}",
        "support" if comp is None or comp.outcome == Outcome.FAILED else "reconciliation",
    )


def _provider_queue_rows(name: str) -> Callable[[QuerySet, int], list]:
    # support.provider_queues renders the disputes and "made outside Verity" rows itself.
    return lambda qs, limit: provider_queues.queue_items(name, limit=limit)


def _quarantined_row_runbook(item) -> str:
    if item.summary.split(" · ", 1)[-1].startswith(MISMATCH_PREFIX):
        return "amount-currency-mismatch"
    return "quarantined-event"


_AS_FETCHED: Rows = lambda objects, now: objects  # noqa: E731 - rows already rendered

# -- the registry, in landing-page order --------------------------------------------------

for _spec in [
    QueueSpec(
        "unknown",
        "Unknown operations",
        Action.VIEW,
        "The provider may have applied these; reconciliation is reading them back.",
        runbook="unknown-operation",
        parts=(
            QueuePart(unknown_operations, "created_at", each(_unknown_row), related=("purchase",)),
        ),
    ),
    QueueSpec(
        "paid_without_order",
        "Paid without order",
        Action.VIEW,
        "Payment verified, no order written yet.",
        runbook="paid-without-order",
        parts=(
            QueuePart(
                paid_without_order,
                "paid_at",
                each(_paid_without_order_row),
                fetch=_paid_without_order_fetch,
                # paid before paid_at was stored: updated_at, as its rows
                oldest_fallback="updated_at",
            ),
        ),
    ),
    QueueSpec(
        "compensation",
        "Compensation needed",
        Action.VIEW,
        "A downstream step failed or is uncertain, or a compensation did not settle.",
        runbook="compensation-needed",
        # recovery's query (an OR with a correlated NOT EXISTS) is estimated at
        # ~200 k at 1 M purchases: alone, so its JIT compiles only itself.
        parts=(
            QueuePart(compensation_steps, "created_at", each(_step_row), count_alone=True),
            QueuePart(compensation_operations, "created_at", each(_compensation_op_row)),
        ),
    ),
    QueueSpec(
        "held",
        "Held provider events",
        Action.VIEW,
        "Signed provider events waiting for the record they name to settle; each "
        "retry asks for a read-back of that record. Old ones need a person.",
        runbook="held-provider-event",
        parts=(QueuePart(held_events, "received_at", each(_held_row)),),
    ),
    QueueSpec(
        "quarantined",
        "Quarantined events",
        Action.VIEW,
        "Signed provider events that did not match their operation.",
        runbook="quarantined-event",
        row_runbook=_quarantined_row_runbook,
        parts=(QueuePart(quarantined_events, "received_at", each(_quarantined_row)),),
    ),
    QueueSpec(
        "mismatch",
        "Amount or currency mismatch",
        Action.VIEW,
        "Quarantined events whose amount, currency, purchase or account disagree "
        "with the operation they name.",
        runbook="amount-currency-mismatch",
        parts=(QueuePart(mismatch_events, "received_at", each(_mismatch_row)),),
    ),
    QueueSpec(
        "stuck_outbox",
        "Stuck outbox",
        Action.VIEW,
        "Follow-up work not processed long after it was due.",
        runbook="stuck-outbox",
        parts=(QueuePart(stuck_outbox, "created_at", each(_outbox_row)),),
    ),
    QueueSpec(
        "settlement",
        "Settlement discrepancies",
        Action.VIEW_SETTLEMENT,
        "Provider balance transactions that disagree with the ledger.",
        runbook="settlement-discrepancy",
        parts=(QueuePart(open_discrepancies, "created_at", _settlement_rows),),
    ),
    QueueSpec(
        "escalated",
        "Escalated to a recovery owner",
        Action.VIEW,
        "Reconciliation deadline passed; a named owner must settle these.",
        runbook="escalated",
        sort_by_since=True,
        parts=(
            QueuePart(
                escalated_operations, "created_at", each(_escalated_row), related=("purchase",)
            ),
        ),
    ),
    QueueSpec(
        "refund_approval",
        "Refunds awaiting approval",
        Action.VIEW,
        "Console and API refunds waiting for a finance approver.",
        runbook="refund-awaiting-approval",
        parts=(
            QueuePart(
                refunds_awaiting_approval,
                "created_at",
                each(_refund_approval_row),
                related=("requested_by_user",),
            ),
        ),
    ),
    QueueSpec(
        "disputes",
        "Disputes",
        Action.VIEW_SETTLEMENT,
        "Open disputes at the provider, the nearest evidence deadline first.",
        runbook="dispute-evidence-due",
        template=provider_queues.QUEUE_TEMPLATES["disputes"],
        parts=(
            QueuePart(
                lambda now: provider_queues.open_disputes(),
                "opened_at",
                _AS_FETCHED,
                fetch=_provider_queue_rows("disputes"),
            ),
        ),
    ),
    QueueSpec(
        "external",
        "Made outside Verity",
        Action.VIEW,
        "Refunds, captures and cancels the provider reported that no Verity operation "
        "requested; a finance user reviews each one.",
        runbook="made-outside-verity",
        template=provider_queues.QUEUE_TEMPLATES["external"],
        parts=(
            QueuePart(
                lambda now: provider_queues.unreviewed_external_operations(),
                "created_at",
                _AS_FETCHED,
                fetch=_provider_queue_rows("external"),
            ),
        ),
    ),
    QueueSpec(
        "overturned",
        "Manual resolution overturned",
        Action.VIEW,
        "Verified provider evidence contradicted a person's resolution; the "
        "operation now shows the provider's outcome. Check what followed.",
        runbook="manual-resolution-overturned",
        parts=(QueuePart(overturned_operations, "settled_at", each(_overturned_row)),),
    ),
    QueueSpec(
        "x402_transfers_reversed",
        "x402 payments the chain took back",
        Action.VIEW,
        "A succeeded x402 payment whose transfer left the chain before its block was "
        "final (a reorg, then the payer cancelled): revenue reversed, goods unwound, "
        "customer told. Check what followed and mark it reviewed.",
        runbook="x402-transfer-reversed",
        parts=(QueuePart(_x402_reversed_operations, "settled_at", each(_x402_reversed_row)),),
    ),
    QueueSpec(
        "duplicates",
        "Duplicate charges",
        Action.VIEW,
        "A second confirmed charge on one purchase, and the linked refund or void that returns it.",
        runbook="duplicate-charge",
        parts=(QueuePart(duplicate_operations, "settled_at", each(_duplicate_row)),),
    ),
]:
    queue_register(_spec)
del _spec
