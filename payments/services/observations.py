"""Applying what the provider said: the one function every source of
evidence goes through (a read-back, a webhook, a dispatch answer), its effects on holds,
the purchase and the workflow, overturns of a person's resolution, and duplicate charges.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef, QuerySet, Sum
from django.utils import timezone

from recovery.models import OutboxCategory
from recovery.outbox import (
    dispatch_put,
    operation_settled_put,
    outbox_put,
    reconcile_put,
    run_steps_put,
)

from ..enums import (
    OVERTURN_CAUSE,
    PAYMENT_KINDS,
    SLOT_HOLDING_OUTCOMES,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    PurchaseStatus,
    Reason,
    RetryAdvice,
    Verification,
)
from ..errors import ApplyResult, DomainError, ErrorCode
from ..keyed import key_complete_with_apply
from ..locks import lock_purchase_and_operation
from ..models import Dispute, OperationTransition, PaymentOperation, Purchase
from ..providers.base import ProviderObject, outcome_from_object
from .common import (
    CallAnswer,
    _dispatch_backstop,
    _op_to,
    _purchase_to,
    call_answer_record,
    call_answer_record_alone,
    change_batch,
    log,
    payment_refund_room,
    provider_for,
    purchase_captured,
    purchase_order_event_put,
    purchase_refunds,
    transition_record,
)
from .holds import _hold_overturn, _hold_settle


def payment_cancel_due(op: PaymentOperation, obj: ProviderObject | None) -> bool:
    """Verity has settled `op` failed on the provider's or its own evidence (never on a
    person's word: the manual path cancels before it settles) and the provider may still
    hold it open: a payment with a PaymentIntent on a rail that can cancel one, whose
    record (when there is one) is still cancellable. Anyone holding the secret key could
    otherwise attach a card and confirm it later: a charge with no order."""
    return (
        op.kind in PAYMENT_KINDS
        and op.outcome == Outcome.FAILED
        and op.grade == Grade.CONFIRMED
        and bool(op.provider_reference)
        and provider_for(op).has_capture_and_void  # a rail whose payments can be cancelled
        and (obj is None or obj.cancellable)
    )


def _cancel_if_left_open_put(op: PaymentOperation, obj: ProviderObject | None) -> None:
    """In the settling transaction: the cancel at the provider follows through the outbox
    (payments.services.cancels.payment_cancel_after_failure), outside any transaction."""
    if payment_cancel_due(op, obj):
        outbox_put(
            category=OutboxCategory.PAYMENT_CANCEL,
            payload={"operation": op.id},
            dedupe_key=f"cancel:{op.id}",
        )


def _expected_amount(op: PaymentOperation) -> int:
    if op.kind in (OperationKind.CAPTURE, OperationKind.VOID) and (parent := op.parent):
        return parent.amount
    return op.amount


def _mismatch(op: PaymentOperation, obj: ProviderObject) -> str:
    """Why this provider object cannot be this operation's, or ''."""
    provider = provider_for(op)
    if obj.object_type != provider.object_type_for(op.kind):
        return f"object type {obj.object_type}"
    # Where the provider's id is not the operation's identity (x402: the authorization is,
    # its transaction hash may only become known later), the id is not compared.
    if op.provider_reference and obj.id != op.provider_reference and provider.reference_is_identity:
        return "provider reference"
    meta = obj.metadata or {}
    allowed_ops = {op.id, op.parent_id} if op.parent_id else {op.id}
    if meta.get("operation_id") and meta["operation_id"] not in allowed_ops:
        return "operation metadata"
    if meta.get("purchase_id") and meta["purchase_id"] != op.purchase_id:
        return "purchase"
    if (
        meta.get("customer_reference")
        and meta["customer_reference"] != op.purchase.customer_reference
    ):
        return "customer reference"
    if obj.amount != _expected_amount(op):
        return "amount"
    if obj.currency.lower() != op.currency.lower():
        return "currency"
    expected_accounts = {"", settings.STRIPE_ACCOUNT or "", op.provider_account or ""}
    if (obj.account or "") not in expected_accounts:
        return "account"
    return ""


_FAIL_REASONS = {
    "card_declined": Reason.CARD_DECLINED,
    "generic_decline": Reason.CARD_DECLINED,
    "insufficient_funds": Reason.CARD_DECLINED,
    # x402 (payments.providers.x402): stable reasons, passed through
    **{
        r.value: r
        for r in (
            Reason.AUTHORIZATION_EXPIRED,
            Reason.AUTHORIZATION_CANCELED,
            Reason.AUTHORIZATION_USED_ELSEWHERE,
            Reason.AUTHORIZATION_INVALID,
            Reason.INSUFFICIENT_BALANCE,
            Reason.PROVIDER_UNREACHABLE,
        )
    },
}


def _settle_effects_refund(
    purchase: Purchase, op: PaymentOperation, *, cause: str, actor: str
) -> None:
    refunded = (
        purchase_refunds(purchase).filter(outcome=Outcome.SUCCEEDED).aggregate(s=Sum("amount"))["s"]
        or 0
    )
    if refunded >= purchase_captured(purchase):
        if purchase.status == PurchaseStatus.DISPUTED:
            # A disputed purchase says so until the dispute closes (docs/webhooks.md#disputes);
            # its closure decides from the money (disputes._closed_status: refunded). The goods
            # unwind now all the same (recovery: the settled refund, on the money).
            return
        if op.grade == Grade.ACKNOWLEDGED:
            # Refunded is shown only after the provider confirms it
            # (docs/reliability.md#rules-every-money-movement-obeys): on a person's word
            # the refund is in progress; the read-back that confirms it says refunded.
            _purchase_to(purchase, "mark_refund_pending", cause=cause, actor=actor)
            return
        _purchase_to(purchase, "mark_refunded", cause=cause, actor=actor)
    else:
        _restore_after_refund(purchase, op, cause=cause, actor=actor)


def _settle_effects(purchase: Purchase, op: PaymentOperation, *, cause: str, actor: str) -> None:
    """What follows an outcome change: holds, purchase status, outbox. Same transaction."""
    o = op.outcome
    if o in (Outcome.SUCCEEDED, Outcome.FAILED):
        _hold_settle(op, succeeded=o == Outcome.SUCCEEDED)
        operation_settled_put(operation_id=op.id)
    if op.kind in PAYMENT_KINDS and op.is_duplicate:
        if o == Outcome.SUCCEEDED:
            duplicate_compensate_locked(purchase=purchase, duplicate=op)
        return  # a duplicate never pays (or un-pays) the purchase
    if (parent := op.parent) is not None and parent.is_duplicate:
        return  # returning a duplicate changes nothing the customer bought
    if op.kind in PAYMENT_KINDS:
        name = {
            Outcome.SUCCEEDED: "mark_paid",
            Outcome.FAILED: "mark_payment_failed",
            Outcome.UNKNOWN: "mark_payment_unknown",
            Outcome.AWAITING_BUYER: "mark_action_required",
            Outcome.AWAITING_PROVIDER: "mark_payment_pending",
        }.get(o)
        if (
            name
            and _purchase_to(purchase, name, cause=cause, actor=actor)
            and o == Outcome.SUCCEEDED
        ):
            run_steps_put(purchase_id=purchase.id)
    elif op.kind == OperationKind.VOID and o == Outcome.SUCCEEDED:
        _purchase_to(purchase, "mark_voided", cause=cause, actor=actor)
    elif op.kind == OperationKind.REFUND:
        if o == Outcome.SUCCEEDED:
            _settle_effects_refund(purchase, op, cause=cause, actor=actor)
        elif o == Outcome.FAILED:
            _restore_after_refund(purchase, op, cause=cause, actor=actor)
        elif o == Outcome.AWAITING_PROVIDER:
            _purchase_to(purchase, "mark_refund_pending", cause=cause, actor=actor)


_RESTORABLE = (
    PurchaseStatus.PAID,
    PurchaseStatus.FULFILLING,
    PurchaseStatus.COMPLETED,
    PurchaseStatus.MANUAL_REVIEW,
)


def _restore_after_refund(
    purchase: Purchase, op: PaymentOperation, *, cause: str, actor: str
) -> None:
    """`refund_pending` only while a refund is in flight
    (docs/reliability.md#rules-every-money-movement-obeys): once the last one
    settles without refunding everything, the purchase goes back to the status it had
    before, with the refund's outcome and reason on the transition; a paid purchase
    resumes fulfilment. Caller holds the purchase lock."""
    if purchase.status != PurchaseStatus.REFUND_PENDING:
        return
    if (
        purchase.operations.filter(kind=OperationKind.REFUND, outcome__in=SLOT_HOLDING_OUTCOMES)
        .exclude(id=op.id)
        .exists()
    ):
        return  # another refund is still in flight
    before = (
        OperationTransition.objects.filter(
            purchase_id=purchase.id,
            operation__isnull=True,
            field="status",
            target=PurchaseStatus.REFUND_PENDING,
        )
        .exclude(source=PurchaseStatus.REFUND_PENDING)
        .order_by("-id")
        .values_list("source", flat=True)
        .first()
    )
    prior = before if before in _RESTORABLE else PurchaseStatus.PAID
    source = purchase.status
    purchase.restore_after_refund(prior)
    purchase.save(update_fields=purchase.status_change_fields())
    transition_record(
        purchase_id=purchase.id,
        operation=None,
        field="status",
        source=source,
        target=purchase.status,
        cause=f"refund_{op.outcome}:{cause}",
        evidence={"refund": op.id, "outcome": op.outcome, "reason": op.reason, "amount": op.amount},
        actor=actor,
    )
    purchase_order_event_put(purchase=purchase, source=source)
    if purchase.status in (PurchaseStatus.PAID, PurchaseStatus.FULFILLING):
        run_steps_put(purchase_id=purchase.id)


def _other_payment_successes(purchase_id: Any, operation_id: Any) -> QuerySet[PaymentOperation]:
    return PaymentOperation.objects.filter(
        purchase_id=purchase_id,
        kind__in=PAYMENT_KINDS,
        outcome=Outcome.SUCCEEDED,
        is_duplicate=False,
    ).exclude(id=operation_id)


# Whether another payment of the purchase succeeded, read in the operation's lock statement
# (locks.lock_purchase_and_operation: after the purchase's lock, under which every payment's
# outcome changes) instead of a statement of its own.
_OTHER_SUCCESS = "other_payment_succeeded"


def _other_payment_success_read() -> dict[str, Exists]:
    return {
        _OTHER_SUCCESS: Exists(_other_payment_successes(OuterRef("purchase_id"), OuterRef("id")))
    }


def _other_payment_success(op: PaymentOperation) -> bool:
    if _OTHER_SUCCESS in op.__dict__:
        return bool(op.__dict__[_OTHER_SUCCESS])
    return _other_payment_successes(op.purchase_id, op.id).exists()


def _voided_by_verity(op: PaymentOperation) -> bool:
    return (
        PaymentOperation.objects.filter(parent=op, kind=OperationKind.VOID)
        .exclude(outcome=Outcome.FAILED)
        .exists()
    )


def _overturned_resolution(op: PaymentOperation) -> dict[str, Any]:
    """Who resolved it by hand, when, and why (from the history row of the resolution)."""
    row = op.transitions.filter(cause="manual_resolution").order_by("-created_at", "-id").first()
    if row is None:
        return {"outcome": op.outcome, "actor": "", "at": None, "reason": ""}
    return {
        "outcome": op.outcome,
        "actor": row.actor,
        "at": row.created_at.isoformat().replace("+00:00", "Z"),
        "reason": (row.evidence or {}).get("reason", ""),
    }


def _overturn_locked(
    purchase: Purchase,
    op: PaymentOperation,
    target: Outcome,
    *,
    verification: str,
    cause: str,
    actor: str,
    evidence: dict[str, Any],
    reason: str,
    obj: ProviderObject | None,
) -> ApplyResult:
    """Verified provider evidence contradicts an acknowledged outcome: the operation takes
    the provider's outcome, graded confirmed; holds, the purchase and a console queue item
    follow. Caller holds both locks."""
    overturned = _overturned_resolution(op)
    source = op.outcome
    fields = [
        "outcome",
        "stage",
        "grade",
        "verification",
        "reason",
        "provider_status",
        "provider_reference",
        "provider_charge",
        "settled_at",
        "next_action_owner",
        "is_duplicate",
        "next_reconcile_at",
        "updated_at",
    ]
    op.next_reconcile_at = None  # the provider has spoken: no further read-back is due
    if obj is not None:
        op.provider_status = obj.status
        op.provider_reference = op.provider_reference or obj.id
        op.provider_charge = obj.latest_charge or op.provider_charge
    op.grade, op.verification, op.settled_at = Grade.CONFIRMED, verification, timezone.now()
    op.next_action_owner = Owner.SUPPORT  # a person must look at what followed their call
    if target == Outcome.SUCCEEDED:
        op.reason = ""
        if op.kind in PAYMENT_KINDS and _other_payment_success(op):
            op.is_duplicate = True
        op.overturn_to_succeeded()
    else:
        op.reason = reason or _FAIL_REASONS.get(
            obj.failure_code if obj else "", Reason.PROVIDER_FAILED
        )
        op.overturn_to_failed()
    op.save(update_fields=fields)
    if target == Outcome.FAILED:
        _cancel_if_left_open_put(op, obj)
    transition_record(
        purchase_id=purchase.id,
        operation=op,
        field="outcome",
        source=source,
        target=op.outcome,
        cause=OVERTURN_CAUSE,
        evidence={
            "overturned": overturned,
            "by": cause,
            "verification": verification,
            "provider": evidence,
        },
        actor=actor,
    )
    _hold_overturn(op, succeeded=target == Outcome.SUCCEEDED)
    # The earlier settled message was processed: a new one (own key) resumes the work.
    outbox_put(
        category=OutboxCategory.OPERATION_SETTLED,
        payload={"operation": op.id},
        dedupe_key=f"settled:{op.id}:overturn:{op.outcome}",
    )
    log.warning(
        "manual resolution overturned operation=%s from=%s to=%s by=%s",
        op.id,
        source,
        op.outcome,
        cause,
    )
    review = "mark_manual_review"
    if op.kind in PAYMENT_KINDS:
        if target == Outcome.SUCCEEDED:
            if op.is_duplicate:
                duplicate_compensate_locked(purchase=purchase, duplicate=op)
            elif _purchase_to(purchase, "mark_paid", cause=OVERTURN_CAUSE, actor=actor):
                run_steps_put(purchase_id=purchase.id)
        else:
            # Shown paid (perhaps fulfilled) on a person's word; the provider says no money
            # came: a person decides what to unwind.
            _purchase_to(purchase, review, cause=OVERTURN_CAUSE, actor=actor)
    elif op.kind == OperationKind.VOID:
        _purchase_to(
            purchase,
            "mark_voided" if target == Outcome.SUCCEEDED else review,
            cause=OVERTURN_CAUSE,
            actor=actor,
        )
    elif op.kind == OperationKind.REFUND:
        if target == Outcome.SUCCEEDED:
            _settle_effects_refund(purchase, op, cause=OVERTURN_CAUSE, actor=actor)
        elif purchase.status in (PurchaseStatus.REFUNDED, PurchaseStatus.REFUND_PENDING):
            # Shown refunded (or in progress) on a person's word, perhaps unwound: the
            # provider says the money stayed; a person decides what to restore.
            _purchase_to(purchase, review, cause=OVERTURN_CAUSE, actor=actor)
    elif op.kind == OperationKind.CAPTURE and target == Outcome.FAILED:
        _purchase_to(purchase, review, cause=OVERTURN_CAUSE, actor=actor)
    return ApplyResult.APPLIED


def duplicate_left(duplicate: PaymentOperation) -> int:
    """What of a duplicate payment the merchant still holds, so what its compensation
    asks for: its refund room (a dashboard refund of it is its own refund)
    minus what the buyer's bank holds in a dispute that is open or lost (the provider
    refuses a refund of a disputed charge; a lost dispute already returned the money).
    A won dispute gave the money back to the merchant: it counts as held again."""
    if (
        duplicate.kind == OperationKind.AUTHORIZE
        and not duplicate.children.filter(
            kind=OperationKind.CAPTURE, outcome=Outcome.SUCCEEDED
        ).exists()
    ):
        return duplicate.amount  # an uncaptured duplicate authorization is voided whole
    return payment_refund_room(duplicate)  # net of what the bank holds (one definition)


def _duplicate_refused(duplicate: PaymentOperation, amount: int) -> bool:
    """The provider already refused a compensation of this duplicate asking this much or
    less: asking again would be refused again. A new one is made only when what is left
    shrank (a dashboard refund or a dispute recorded since); otherwise the duplicate
    waits in the duplicates queue for a person."""
    refused = PaymentOperation.objects.filter(
        parent=duplicate,
        is_compensation=True,
        outcome=Outcome.FAILED,
        reason=Reason.PROVIDER_REFUSED,
        amount__lte=amount,
    )
    # A dispute closed since (won: the money came back) makes the refusal stale.
    closed = Dispute.objects.filter(payment=duplicate, closed_at__isnull=False).aggregate(
        m=Max("closed_at")
    )["m"]
    if closed is not None:
        refused = refused.filter(updated_at__gt=closed)
    return refused.exists()


def _rail_cannot_refund(duplicate: PaymentOperation) -> bool:
    """The duplicate's rail cannot send a refund here (x402: a transfer back from the
    refund signer, and none is configured): no compensation can leave (it would hold the
    purchase's slot for ever), so the duplicate waits in the duplicates queue for a person
    (as refund_request refuses)."""
    return provider_for(duplicate).refund_refusal() is not None


def duplicate_compensate_locked(
    *, purchase: Purchase, duplicate: PaymentOperation
) -> PaymentOperation | None:
    """The linked refund (or void, for an authorization) that returns a duplicate charge:
    its own operation and key, on the duplicate's own rail (an x402 duplicate is returned
    by a transfer back to its payer, never a card refund), for what is left
    of it, dispatched through the outbox and reconciled like any other.
    None while another operation holds the purchase's slot (the settled handler tries
    again) or when nothing is left to return. Caller holds the purchase lock."""
    existing = (
        PaymentOperation.objects.filter(parent=duplicate, is_compensation=True)
        .exclude(outcome=Outcome.FAILED)
        .first()
    )
    if existing is not None:
        return existing
    kind = OperationKind.VOID if duplicate.kind == OperationKind.AUTHORIZE else OperationKind.REFUND
    amount = duplicate_left(duplicate)
    if amount <= 0 or _duplicate_refused(duplicate, amount) or _rail_cannot_refund(duplicate):
        return None
    try:
        with transaction.atomic():
            comp = PaymentOperation.objects.create(
                purchase=purchase,
                kind=kind,
                amount=amount,
                currency=duplicate.currency,
                parent=duplicate,
                is_compensation=True,
                rail=duplicate.rail,
                provider_reference=(
                    duplicate.provider_reference if kind == OperationKind.VOID else ""
                ),
            )
            _dispatch_backstop(comp)
            dispatch_put(operation_id=comp.id)
    except IntegrityError:
        return None
    transition_record(
        purchase_id=purchase.id,
        operation=comp,
        field="outcome",
        source="",
        target=comp.outcome,
        cause="duplicate_compensation",
        evidence={"duplicate": duplicate.id, "rail": duplicate.rail, "amount": amount},
        actor="system",
    )
    return comp


def duplicate_compensation_ensure(*, operation_id: str) -> PaymentOperation | None:
    """Idempotent: make sure a confirmed duplicate has its compensation. Raises
    DomainError `payment_unresolved` while the purchase's slot is busy (retry later);
    None when nothing of the duplicate is left to return (refunded in the dashboard, or
    held by the buyer's bank in a dispute), or the provider refused that much already."""
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id)
        if not (op.is_duplicate and op.outcome == Outcome.SUCCEEDED):
            return None
        comp = duplicate_compensate_locked(purchase=purchase, duplicate=op)
        left = duplicate_left(op)
        if (
            comp is None
            and left > 0
            and not _duplicate_refused(op, left)
            and not _rail_cannot_refund(op)
        ):
            raise DomainError(
                ErrorCode.PAYMENT_UNRESOLVED,
                "Another operation on this purchase is "
                "not settled yet; the duplicate's refund waits for it.",
                status=409,
                retry=RetryAdvice.SAME_KEY,
                owner=Owner.RECONCILIATION,
                purchase=purchase.id,
                operation=op.id,
            )
        return comp


def _schedule_reconcile(op: PaymentOperation, *, first: bool) -> None:
    schedule = settings.RECONCILE_SCHEDULE_SECONDS
    now = timezone.now()
    if first:
        op.reconcile_attempts = 0
        op.reconcile_deadline = now + timedelta(seconds=settings.RECONCILE_DEADLINE_SECONDS)
    delay = schedule[min(op.reconcile_attempts, len(schedule) - 1)]
    op.next_reconcile_at = now + timedelta(seconds=delay)
    op.next_action_owner = Owner.RECONCILIATION
    op.save(
        update_fields=[
            "reconcile_attempts",
            "reconcile_deadline",
            "next_reconcile_at",
            "next_action_owner",
            "updated_at",
        ]
    )
    reconcile_put(operation_id=op.id, delay_seconds=delay)


def outcome_apply_locked(
    purchase: Purchase,
    op: PaymentOperation,
    target: Outcome,
    *,
    grade: str,
    verification: str,
    cause: str,
    actor: str,
    evidence: dict[str, Any],
    reason: str = "",
    obj: ProviderObject | None = None,
    final: bool = True,
) -> ApplyResult:
    """Move an operation to the outcome `target` and run what follows (holds, purchase
    status, outbox), the one transition path for evidence and for people alike; the
    caller holds the purchase and operation locks (payments.locks) in its transaction.
    A terminal outcome never regresses: the same one upgrades a person's word to the
    provider's, a different one is a conflict, or an overturn when final.

    `final`: the evidence is the provider's last word on this object (a read-back, or
    an event whose status cannot change any more); only final evidence overturns a
    person's resolution, anything else is a conflict settled by a read-back."""
    current = op.outcome
    if current in (Outcome.SUCCEEDED, Outcome.FAILED):
        if target == current:
            # Only the provider's last word confirms a person's: a declined attempt's event
            # may be older than a success of the same PaymentIntent.
            if op.grade == Grade.ACKNOWLEDGED and grade == Grade.CONFIRMED and final:
                op.grade, op.verification = grade, verification  # evidence upgrades a manual
                fields = ["grade", "verification", "updated_at"]
                if obj is not None and not op.provider_reference:
                    # Found by metadata (a one-call payment whose answer was lost): the
                    # agreeing object is this payment's, kept by its id as every other
                    # settled payment is — a capture, a refund, a cancel need it.
                    op.provider_reference, op.provider_status = obj.id, obj.status
                    op.provider_charge = obj.latest_charge or op.provider_charge
                    fields += ["provider_reference", "provider_status", "provider_charge"]
                op.save(update_fields=fields)
                if current == Outcome.FAILED:
                    # A person's failure the provider confirms on a PaymentIntent it still
                    # holds payable (declined, requires_payment_method): cancelled there.
                    _cancel_if_left_open_put(op, obj)
                transition_record(
                    purchase_id=purchase.id,
                    operation=op,
                    field="outcome",
                    source=current,
                    target=current,
                    cause=f"confirmed:{cause}"[:64],
                    evidence=evidence,
                    actor=actor,
                )
                if (
                    current == Outcome.FAILED
                    and op.is_compensation
                    and (parent := op.parent) is not None
                    and parent.is_duplicate
                ):
                    # A duplicate's return a person called failed is re-asked only once the
                    # provider confirms that (recovery.orchestrator.operation_settled).
                    operation_settled_put(operation_id=op.id)
                if (
                    current == Outcome.SUCCEEDED
                    and op.kind == OperationKind.REFUND
                    and not ((parent := op.parent) is not None and parent.is_duplicate)
                ):
                    # The provider confirms a person's "refunded": now it may be shown.
                    _settle_effects_refund(purchase, op, cause=cause, actor=actor)
                return ApplyResult.APPLIED
            return ApplyResult.NO_CHANGE
        if target in (Outcome.SUCCEEDED, Outcome.FAILED):
            if op.grade == Grade.ACKNOWLEDGED and grade == Grade.CONFIRMED and final:
                # The provider's record outranks a person
                # (docs/reliability.md#the-providers-record-outranks-a-person).
                return _overturn_locked(
                    purchase,
                    op,
                    target,
                    verification=verification,
                    cause=cause,
                    actor=actor,
                    evidence=evidence,
                    reason=reason,
                    obj=obj,
                )
            return ApplyResult.CONFLICT
        return ApplyResult.STALE  # a late non-terminal never regresses a terminal outcome
    if target == current:
        return ApplyResult.NO_CHANGE
    fields = [
        "grade",
        "verification",
        "reason",
        "provider_status",
        "provider_reference",
        "provider_charge",
        "next_action_owner",
        "settled_at",
    ]
    if obj is not None:
        op.provider_status = obj.status
        op.provider_reference = op.provider_reference or obj.id
        op.provider_charge = obj.latest_charge or op.provider_charge
    if target == Outcome.SUCCEEDED and op.kind in PAYMENT_KINDS and _other_payment_success(op):
        # A second confirmed charge on one purchase: the one confirmed later is the
        # duplicate; it is recorded as the provider did it and returned by a linked refund.
        op.is_duplicate = True
        fields.append("is_duplicate")
    if target in (Outcome.SUCCEEDED, Outcome.FAILED):
        op.grade, op.verification = grade, verification
        op.settled_at = timezone.now()
        op.next_action_owner = Owner.NONE
        op.next_reconcile_at = None
        fields.append("next_reconcile_at")
        if target == Outcome.FAILED:
            op.reason = reason or _FAIL_REASONS.get(
                obj.failure_code if obj else "", Reason.PROVIDER_FAILED
            )
            if op.kind in PAYMENT_KINDS:
                op.next_action_owner = Owner.BUYER
        name = "settle_succeeded" if target == Outcome.SUCCEEDED else "settle_failed"
    elif target == Outcome.AWAITING_BUYER:
        op.next_action_owner, name = Owner.BUYER, "mark_awaiting_buyer"
    elif target == Outcome.AWAITING_PROVIDER:
        op.next_action_owner, name = Owner.RECONCILIATION, "mark_awaiting_provider"
    elif target == Outcome.UNKNOWN:
        op.next_action_owner, name = Owner.RECONCILIATION, "mark_unknown"
    else:
        return ApplyResult.NO_CHANGE
    _op_to(op, name, cause=cause, actor=actor, evidence=evidence, fields=tuple(fields))
    if target in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER):
        _schedule_reconcile(
            op,
            first=current
            not in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER),
        )
    _settle_effects(purchase, op, cause=cause, actor=actor)
    if target == Outcome.FAILED:
        _cancel_if_left_open_put(op, obj)
    return ApplyResult.APPLIED


def operation_apply_observation(
    *,
    operation_id: str,
    obj: ProviderObject,
    source: str,
    cause: str,
    actor: str = "",
    purchase_id: str = "",
    answer: CallAnswer | None = None,
) -> ApplyResult:
    """THE one place a provider observation (sync answer, read-back, webhook) changes an
    operation. Checks that the object is this operation's before anything is applied.
    `purchase_id`: the operation's purchase, when the caller knows it (saves a read).
    `answer`: the provider call that brought `obj`, recorded in this transaction (on its
    own if the apply fails). Its history rows, events, outbox rows, the call's answer and
    a key this apply completes (payments.keyed) go in the transaction's last statement,
    as the reconcile sweep writes the same apply's."""
    try:
        with transaction.atomic(), change_batch():
            if answer is not None:
                call_answer_record(answer)
            purchase, op = lock_purchase_and_operation(
                operation_id, purchase_id=purchase_id, **_other_payment_success_read()
            )
            applied = _apply_observation_locked(
                purchase, op, obj, source=source, cause=cause, actor=actor
            )
            if applied == ApplyResult.APPLIED:
                key_complete_with_apply(op)
            return applied
    except Exception:
        if answer is not None:
            call_answer_record_alone(answer)
        raise


def _apply_observation_locked(
    purchase: Purchase,
    op: PaymentOperation,
    obj: ProviderObject,
    *,
    source: str,
    cause: str,
    actor: str = "",
) -> ApplyResult:
    """`operation_apply_observation` once both locks are held (the set-based reconcile
    sweep takes them for a whole batch)."""
    why = _mismatch(op, obj)
    if why:
        transition_record(
            purchase_id=purchase.id,
            operation=op,
            field="outcome",
            source=op.outcome,
            target=op.outcome,
            cause=f"mismatch:{why}",
            evidence=obj.safe_fields(),
            actor=actor,
        )
        return ApplyResult.MISMATCH
    target = outcome_from_object(obj, kind=op.kind)
    if target is None:
        return ApplyResult.NO_CHANGE
    if (
        op.kind == OperationKind.AUTHORIZE
        and obj.canceled
        and op.outcome == Outcome.SUCCEEDED
        and _voided_by_verity(op)
    ):
        # A canceled PaymentIntent after Verity's own void agrees with Verity: the
        # authorization did succeed, and the void cancelled it.
        return ApplyResult.NO_CHANGE
    final = source == Verification.PROVIDER or obj.final
    return outcome_apply_locked(
        purchase,
        op,
        target,
        grade=Grade.CONFIRMED,
        verification=source,
        cause=cause,
        actor=actor,
        evidence=obj.safe_fields(),
        obj=obj,
        final=final,
    )


def _settle_without_object(
    operation_id: str,
    target: Outcome,
    *,
    reason: str,
    cause: str,
    evidence: dict[str, Any] | None = None,
    verification: str = Verification.UNVERIFIED,
) -> None:
    """failed with evidence that is not an object (not_sent thrice, declined without
    object, never confirmed) or unknown."""
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id)
        grade = Grade.CONFIRMED if target == Outcome.FAILED else Grade.NONE
        outcome_apply_locked(
            purchase,
            op,
            target,
            grade=grade,
            verification=verification,
            cause=cause,
            actor="dispatcher",
            evidence=evidence or {},
            reason=reason,
        )
