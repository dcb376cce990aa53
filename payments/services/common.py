"""Shared by the services modules: the audit trail of transitions (history), the
transition helpers, workflow halts as they bind a dispatch, and small reads of a
purchase's money that several steps need.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import Now

from audit.services import audit_write
from events.record import event_batch, event_record_transition
from recovery.halts import is_halted
from recovery.models import OutboxCategory
from recovery.outbox import (
    DATABASE_NOW,
    JoinedWrite,
    outbox_batch,
    outbox_joined_name,
    outbox_joins,
    outbox_put,
    outbox_write_joined,
    row_update_sql,
    rows_insert_sql,
)

from ..enums import (
    DISPUTE_FUNDS_WITH_BANK_STATUSES,
    TERMINAL_OUTCOMES,
    Grade,
    OperationKind,
    Outcome,
    PurchaseStatus,
    Reason,
)
from ..errors import DomainError, ErrorCode
from ..locks import lock_purchase_and_operation
from ..models import (
    ApiClient,
    Dispute,
    OperationTransition,
    PaymentOperation,
    ProviderCall,
    Purchase,
    PurchaseChannel,
)
from ..providers.base import CallResult, PaymentRequest, RailAdapter
from ..providers.registry import adapter_for_rail

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger("verity.payments")


def _halted(name: str) -> bool:
    return is_halted(name)


# The workflow whose halt binds each kind of dispatch
# (docs/reliability.md#rules-every-money-movement-obeys): money in, or money
# back out (voids, refunds and compensations obey `refunds`).
_WORKFLOW_OF_KIND = {
    OperationKind.CHARGE: "checkout",
    OperationKind.AUTHORIZE: "checkout",
    OperationKind.CAPTURE: "checkout",
    OperationKind.VOID: "refunds",
    OperationKind.REFUND: "refunds",
}


def operation_workflow(kind: str) -> str:
    return _WORKFLOW_OF_KIND[OperationKind(kind)]


_HISTORY_BATCH = threading.local()


@contextmanager
def history_batch() -> Iterator[None]:
    """Inside the caller's transaction: history rows written by `transition_record` are
    collected and inserted in one statement when the block ends (discarded if it raises, as
    the transaction is). For a set-based apply (the reconcile sweep) whose steps never read
    back the history rows they write in the same block."""
    if getattr(_HISTORY_BATCH, "rows", None) is not None:
        yield  # already collecting: the outer block inserts
        return
    _HISTORY_BATCH.rows = []
    try:
        yield
        rows = _HISTORY_BATCH.rows
        _HISTORY_BATCH.rows = None
        if rows and outbox_joins():
            # In the change's one statement (change_batch), after the events' view reads.
            sql, params = rows_insert_sql(rows)
            outbox_write_joined(JoinedWrite(ctes=((outbox_joined_name("history"), sql, params),)))
        elif rows:
            OperationTransition.objects.bulk_create(rows)
    finally:
        _HISTORY_BATCH.rows = None


@contextmanager
def change_batch() -> Iterator[None]:
    """Inside the caller's transaction, around one service's whole change: its history
    rows, outbox messages and storefront events are written when the block ends
    (discarded if it raises, as the transaction is). The events' view is read first (the
    view the change leaves); then, on PostgreSQL, the events, their fan-out messages, the
    history rows, the other messages and any other write joined to the batch
    (recovery.outbox.outbox_write_joined) go in ONE statement."""
    with outbox_batch(), history_batch(), event_batch():
        yield


def transition_record(
    *,
    purchase_id: str,
    operation: PaymentOperation | None,
    field: str,
    source: str,
    target: str,
    cause: str,
    evidence: dict[str, Any] | None = None,
    actor: str = "",
) -> None:
    """Append one row to the purchase's transition history (OperationTransition): a
    purchase's status (`operation=None`) or an operation's outcome moved from `source` to
    `target`, why (`cause`), on what evidence and by whom. Inside the caller's transaction,
    so a change and its history commit together; batched inside `history_batch()`."""
    row = OperationTransition(
        purchase_id=purchase_id,
        operation=operation,
        field=field,
        source=source,
        target=target,
        cause=cause,
        evidence=evidence or {},
        actor=actor,
    )
    # The storefront's event for this change, if it makes one (events.record): here, where
    # every transition is recorded, so no change commits without its event.
    event_record_transition(
        purchase_id=purchase_id,
        operation=operation,
        field=field,
        source=source,
        target=target,
        cause=cause,
        evidence=evidence,
    )
    batch = getattr(_HISTORY_BATCH, "rows", None)
    if batch is not None:
        batch.append(row)
        return
    row.save(force_insert=True)


def _purchase_to(
    purchase: Purchase,
    name: str,
    *args: Any,
    cause: str,
    actor: str = "",
    evidence: dict[str, Any] | None = None,
) -> bool:
    """Apply a purchase FSM transition (with its arguments) if allowed; record it with its
    order event. The one place a purchase's status moves. Caller holds the lock."""
    method = getattr(purchase, name)
    from django_fsm import can_proceed

    if not can_proceed(method):
        return False
    source = purchase.status
    method(*args)
    if purchase.status == source:
        return False
    purchase.save(update_fields=purchase.status_change_fields())
    transition_record(
        purchase_id=purchase.id,
        operation=None,
        field="status",
        source=source,
        target=purchase.status,
        cause=cause,
        evidence=evidence,
        actor=actor,
    )
    purchase_order_event_put(purchase=purchase, source=source)
    return True


# The statuses of a purchase that is an order (paid, then whatever became of it).
ORDER_STATUSES = frozenset(
    {
        PurchaseStatus.PAID,
        PurchaseStatus.FULFILLING,
        PurchaseStatus.COMPLETED,
        PurchaseStatus.REFUND_PENDING,
        PurchaseStatus.REFUNDED,
        PurchaseStatus.DISPUTED,
        PurchaseStatus.DISPUTE_WON,
        PurchaseStatus.DISPUTE_LOST,
        PurchaseStatus.VOIDED,
    }
)


def purchase_order_event_put(*, purchase: Purchase, source: str) -> None:
    """An ACP purchase's order moved: the outbox row that tells its agent platform
    (delivered by acp.handlers), written by the service that saved the transition, in
    its transaction — never from a django-fsm signal (a signal would hide the write from its
    service). Call it once per saved
    status change; `source` is the status before it. `order_create` the first time the
    purchase becomes an order, `order_update` for every later move (a purchase that left
    the order statuses and came back, e.g. through manual review, is the same order)."""
    target = purchase.status
    if purchase.channel != PurchaseChannel.ACP or target == source or target not in ORDER_STATUSES:
        return
    # Its order-status history, this transition included (written just before this call,
    # or collected by history_batch and counted from there).
    entered = list(
        OperationTransition.objects.filter(
            purchase_id=purchase.id,
            field="status",
            operation__isnull=True,
            target__in=ORDER_STATUSES,
        ).values_list("target", flat=True)
    )
    entered += [
        row.target
        for row in getattr(_HISTORY_BATCH, "rows", None) or ()
        if row.purchase_id == purchase.id
        and row.field == "status"
        and row.operation_id is None
        and row.target in ORDER_STATUSES
    ]
    event = "order_create" if len(entered) <= 1 else "order_update"
    payload: dict[str, Any] = {"purchase": purchase.id, "event": event, "status": str(target)}
    # The receiver dedupes on the event's id (purchase, status): a purchase entering the
    # same status again (paid, refund pending, paid) is a new event, numbered by how many
    # times it has entered it.
    n = entered.count(target)
    if n > 1:
        payload["n"] = n
    outbox_put(
        category=OutboxCategory.ACP_ORDER_EVENT,
        payload=payload,
        dedupe_key=f"acp-order:{purchase.id}:{target}" + (f":{n}" if n > 1 else ""),
    )


def _op_to(
    op: PaymentOperation,
    name: str,
    *,
    cause: str,
    actor: str = "",
    evidence: dict[str, Any] | None = None,
    fields: tuple[Any, ...] = (),
) -> None:
    source = op.outcome
    getattr(op, name)()
    op.save(update_fields=["outcome", "stage", "updated_at", *fields])
    transition_record(
        purchase_id=op.purchase_id,
        operation=op,
        field="outcome",
        source=source,
        target=op.outcome,
        cause=cause,
        evidence=evidence,
        actor=actor,
    )


def _dispatch_backstop(op: PaymentOperation) -> None:
    """The caller dispatches right after commit; if its process dies first, this delayed
    outbox message sends the queued operation anyway (a second dispatch is a no-op), so a
    `pending` operation never holds its purchase's slot forever."""
    outbox_put(
        category=OutboxCategory.DISPATCH,
        payload={"operation": op.id},
        dedupe_key=f"dispatch-backstop:{op.id}",  # never absorbs a prompt dispatch
        delay_seconds=settings.IDEMPOTENCY_LEASE_SECONDS + 5,
    )


def payment_unsettled(payment: PaymentOperation) -> bool:
    """Verity's own record of a payment is not settled yet: no terminal outcome, or a
    person's "failed" still awaiting the provider's read-back (it may be overturned)."""
    return payment.outcome not in TERMINAL_OUTCOMES or (
        payment.outcome == Outcome.FAILED and payment.grade == Grade.ACKNOWLEDGED
    )


# -- refundable room (see docs/reliability.md#rules-every-money-movement-obeys)
#
# A refund belongs to the payment it returns (its `parent`: the charge, or the
# authorization whose captures it reverses). The room of a payment is what that payment
# captured minus its own refunds that are not `failed` (in flight ones included: their
# money may already be on its way back). The room of a purchase is the sum over its own
# payments: a duplicate charge and the refund that returns it are the duplicate's, never
# the purchase's. Request, approval, the automatic allowance, external refunds and the
# console all ask these two functions: two derivations disagree (one that counts the
# duplicate's compensation refuses at approval a refund the request accepted).


def payment_captured(payment: PaymentOperation) -> int:
    """What one payment took from the buyer: a succeeded charge's amount, or the sum of
    an authorization's succeeded captures."""
    if payment.outcome != Outcome.SUCCEEDED:
        return 0
    if payment.kind == OperationKind.CHARGE:
        return payment.amount
    if payment.kind == OperationKind.AUTHORIZE:
        return (
            PaymentOperation.objects.filter(
                parent=payment, kind=OperationKind.CAPTURE, outcome=Outcome.SUCCEEDED
            ).aggregate(s=Sum("amount"))["s"]
            or 0
        )
    return 0


def payment_refunds(payment: PaymentOperation) -> QuerySet[PaymentOperation]:
    """The refunds that return money of this one payment (compensations included)."""
    return PaymentOperation.objects.filter(parent=payment, kind=OperationKind.REFUND)


# A refund a person settled `failed` after it was sent (a manual resolution, graded
# acknowledged) may have moved money all the same: the provider may show it succeeded
# once it can be read (a second refund sent meanwhile would pay the buyer back twice).
# It keeps its amount out of the room, and counts against an allowance, until
# the provider's read-back confirms or overturns it. A refund finance declined was never
# sent (`refund_declined`): its "failed" is the whole truth.
REFUND_FAILURE_UNVERIFIED = Q(outcome=Outcome.FAILED, grade=Grade.ACKNOWLEDGED) & ~Q(
    reason=Reason.REFUND_DECLINED
)


def refund_may_have_moved() -> Q:
    """The refunds whose money may be on its way back, or back: every one not failed, and
    one only a person called failed (REFUND_FAILURE_UNVERIFIED)."""
    return ~Q(outcome=Outcome.FAILED) | REFUND_FAILURE_UNVERIFIED


def payment_refund_room(
    payment: PaymentOperation,
    *,
    exclude: str | None = None,
    counted: tuple[str, ...] | None = None,
    pending_approval: bool = True,
    net_of_chargebacks: bool = True,
) -> int:
    """Captured minus this payment's refunds that may have moved money (never below 0):
    not failed, or failed on a person's word only (REFUND_FAILURE_UNVERIFIED), minus what
    the buyer's bank holds in a chargeback open or lost (payment_disputed_with_bank).
    `exclude`: an operation id left out (the refund being approved is not its own
    competitor). `counted`: the outcomes that count, when a caller judges a provider's
    fact against Verity's confirmed record only (external refunds: succeeded).
    `pending_approval=False`: refunds awaiting approval are left out (a compensation
    supersedes them: nothing has left, and finance may decline them).
    `net_of_chargebacks=False`: what the provider itself can still refund, for judging a
    refund the provider already made (it is a fact; the bank's hold limits only what
    Verity may ask for)."""
    refunds = payment_refunds(payment)
    if exclude:
        refunds = refunds.exclude(pk=exclude)
    if not pending_approval:
        refunds = refunds.exclude(outcome=Outcome.AWAITING_APPROVAL)
    refunds = (
        refunds.filter(outcome__in=counted)
        if counted is not None
        else refunds.filter(refund_may_have_moved())
    )
    return max(
        0,
        payment_captured(payment)
        - (refunds.aggregate(s=Sum("amount"))["s"] or 0)
        - (payment_disputed_with_bank(payment) if net_of_chargebacks else 0),
    )


def payment_disputed_with_bank(payment: PaymentOperation) -> int:
    """What the buyer's bank holds of this payment in a chargeback that is open or lost:
    an open one the provider refuses to refund (`is_charge_refundable` false), a lost one
    already gave the money back. A refund of it on top would return it twice. An inquiry
    (warning_*) moves no funds and a won chargeback gave them back to the merchant: neither
    counts."""
    return (
        Dispute.objects.filter(
            payment=payment, status__in=DISPUTE_FUNDS_WITH_BANK_STATUSES
        ).aggregate(s=Sum("amount"))["s"]
        or 0
    )


def purchase_own_payments(purchase: Purchase) -> QuerySet[PaymentOperation]:
    """The purchase's own payments (a duplicate is not one)."""
    return purchase.operations.filter(
        kind__in=(OperationKind.CHARGE, OperationKind.AUTHORIZE), is_duplicate=False
    )


def purchase_refund_room(purchase: Purchase, *, exclude: str | None = None) -> int:
    """The sum of the room of the purchase's own payments."""
    return sum(
        payment_refund_room(p, exclude=exclude)
        for p in purchase_own_payments(purchase).filter(outcome=Outcome.SUCCEEDED)
    )


def purchase_captured(purchase: Purchase) -> int:
    """What the purchase's own payments captured (payment_captured of each; a duplicate
    is not one)."""
    return sum(payment_captured(p) for p in purchase_own_payments(purchase))


def purchase_refunds(purchase: Purchase) -> QuerySet[PaymentOperation]:
    """The refunds of the purchase's own payments (payment_refunds of each): a duplicate's
    compensation is the duplicate's, never the purchase's."""
    return PaymentOperation.objects.filter(
        kind=OperationKind.REFUND, parent__in=purchase_own_payments(purchase)
    )


def _actor(api_client: ApiClient | None, acting_user: User | None) -> str:
    if acting_user is not None:
        return acting_user.get_username()
    return api_client.name if api_client is not None else "system"


def _lock_or_404(operation_id: str) -> tuple[Purchase, PaymentOperation]:
    try:
        return lock_purchase_and_operation(operation_id)
    except PaymentOperation.DoesNotExist:
        raise DomainError(ErrorCode.NOT_FOUND, "No such operation.", status=404) from None


def operation_audit_write(
    *,
    actor: str,
    action: str,
    op: PaymentOperation,
    reason: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """The audit row (audit.services.audit_write) of a person's or the provider's action on
    one operation, in the caller's transaction (the action and its row commit together)."""
    audit_write(
        actor=actor,
        action=action,
        target_type="operation",
        target_id=op.id,
        purchase_id=op.purchase_id,
        reason=reason,
        detail=detail or {},
    )


# -- the rail seam (docs/architecture.md) ------------------------------------------------
# The operation's rail picks its adapter (payments/providers/registry.py); the services
# ask the adapter what the rail can do and never test `op.rail` themselves.


def provider_for_rail(rail: str) -> RailAdapter:
    """The adapter of `rail` (UnknownRail when none is registered)."""
    return adapter_for_rail(rail)


def provider_metadata(op: PaymentOperation) -> dict[str, Any]:
    """The metadata every provider object of an operation carries: its operation and purchase
    ids and the customer reference, so a webhook or a read by metadata finds the operation
    without Verity's answer."""
    return {
        "operation_id": op.id,
        "purchase_id": op.purchase_id,
        "customer_reference": op.purchase.customer_reference,
    }


def payment_request(op: PaymentOperation) -> PaymentRequest:
    """A payment's provider parameters, from the stored operation alone: the one-call
    payment's re-send under the same key must be the request first sent (the provider
    compares parameters and refuses a key reused with others)."""
    return {
        "amount": op.amount,
        "currency": op.currency,
        "payment_method": op.payment_method,
        "capture_method": op.capture_method,
        "metadata": provider_metadata(op),
    }


def provider_for(op: PaymentOperation) -> RailAdapter:
    """The adapter of the operation's rail: the one way the services reach a provider."""
    return adapter_for_rail(op.rail)


@dataclass(frozen=True)
class RailEvidence:
    """A rail that keeps its evidence in Verity's own tables (x402: the authorization and
    the refund's transfer back) reads back and sends refunds through its own services,
    which read and write those rows; a rail without one reads back and dispatches through
    its adapter's API calls alone (payments.providers.base.PaymentProvider)."""

    read_back: Callable[[PaymentOperation], CallResult]
    refund_send: Callable[[PaymentOperation], None]


_RAIL_EVIDENCE: dict[str, RailEvidence] = {}


def rail_evidence_register(rail: str, evidence: RailEvidence) -> None:
    """Called once by the rail's services module (payments/services/__init__.py imports
    it), so the generic read-back and dispatch need not import it."""
    provider_for_rail(rail)  # only a registered rail
    _RAIL_EVIDENCE[str(rail)] = evidence


def rail_evidence_for(rail: str) -> RailEvidence | None:
    return _RAIL_EVIDENCE.get(str(rail))


def _call_answer(result: CallResult) -> dict[str, Any]:
    return {
        "http_status": result.http_status,
        "classification": result.classification,
        "request_id": result.request_id[:100],
        "error_code": result.error_code[:64],
        "fault_drill": result.fault_drill,
        "safe_fields": (
            result.object.safe_fields() if result.object else {"detail": result.detail}
        ),
    }


def _record_call(call: ProviderCall, result: CallResult) -> None:
    # The answer's time from the database's clock, as the send's own (`started_at`): a
    # send's stamps bound the read by metadata, whichever host sent it.
    ProviderCall.objects.filter(id=call.id).update(**_call_answer(result), finished_at=Now())


@dataclass(frozen=True)
class CallAnswer:
    """A provider call's answer that the transaction applying it records
    (`call_answer_record`), in that transaction's last statement instead of one of its
    own; if the apply fails, it is recorded on its own all the same
    (`call_answer_record_alone`): an answer is never lost."""

    call: ProviderCall
    result: CallResult


def call_answer_record(answer: CallAnswer) -> None:
    """In the applying transaction, inside its change batch: joins the batch's statement
    (its time is that statement's, on the database's clock: a later bound of when the
    provider answered, never an earlier one), or is written now outside PostgreSQL."""
    if not outbox_joins():
        _record_call(answer.call, answer.result)
        return
    values = {**_call_answer(answer.result), "finished_at": DATABASE_NOW}
    sql, params = row_update_sql(ProviderCall, answer.call.id, values)
    outbox_write_joined(JoinedWrite(ctes=((outbox_joined_name("call_answer"), sql, params),)))


def call_answer_record_alone(answer: CallAnswer) -> None:
    """The answer of an apply that rolled back, recorded on its own (no transaction)."""
    try:
        _record_call(answer.call, answer.result)
    except Exception:  # noqa: BLE001 - the apply's own error is the one to raise
        log.exception("provider call %s: its answer could not be recorded", answer.call.id)
