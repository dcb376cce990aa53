"""People: a manual resolution (after a read-back: the provider's record
outranks a person) and the review of an overturned one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import transaction

from audit.models import Resolution

from ..enums import (
    OVERTURN_CAUSE,
    PAYMENT_KINDS,
    Classification,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    Reason,
    RetryAdvice,
    Verification,
)
from ..errors import DomainError, ErrorCode
from ..locks import assert_outside_transaction
from ..models import ApiClient, PaymentOperation, Purchase
from ..providers.base import (
    CallResult,
    ProviderObject,
    outcome_from_object,
    shows_no_money_moved,
)
from .cancels import payment_cancel_outside_transaction
from .common import (
    _lock_or_404,
    operation_audit_write,
    operation_workflow,
    transition_record,
)
from .observations import _mismatch, operation_apply_observation, outcome_apply_locked
from .reconcile import (
    _read_back,
    _schedule_acknowledged_read_back,
    created_unconfirmed_adopt,
    refund_never_received,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def _refuse_unresolvable(
    op: PaymentOperation, *, acting_client: ApiClient | None, acting_user: User | None
) -> None:
    if (acting_client is not None and op.requested_by_client_id == acting_client.id) or (
        acting_user is not None and op.requested_by_user_id == acting_user.id
    ):
        raise DomainError(
            ErrorCode.RESOLVER_IS_REQUESTER,
            "The requester of an operation cannot resolve it.",
            status=403,
            operation=op.id,
            purchase=op.purchase_id,
            owner=Owner.SUPPORT,
        )
    if op.outcome not in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER):
        raise DomainError(
            ErrorCode.NOT_RESOLVABLE,
            f"An operation that is {op.outcome} cannot be resolved by hand.",
            status=409,
            operation=op.id,
            purchase=op.purchase_id,
            owner=Owner.NONE,
        )


def _provider_contradicts(op: PaymentOperation, obj: ProviderObject, proposed: str) -> None:
    raise DomainError(
        ErrorCode.PROVIDER_CONTRADICTS,
        f"The provider's record contradicts '{proposed}': it shows {obj.object_type} "
        f"{obj.id} as '{obj.status}'. That record was applied; the resolution was not.",
        status=409,
        retry=RetryAdvice.FORBIDDEN,
        owner=Owner.SUPPORT,
        purchase=op.purchase_id,
        operation=op.id,
        extra={"provider": {"object": obj.object_type, "id": obj.id, "status": obj.status}},
    )


def _cancel_before_manual_failure_outside_transaction(
    op: PaymentOperation, *, actor: str, reason: str
) -> None:
    """Cancel the PaymentIntent at the provider before a person settles it `failed`.

    A write: claimed and audited in one transaction (three phases,
    payments.services.cancels), refused if the provider does not confirm the cancel."""

    def audit(locked: PaymentOperation) -> None:
        operation_audit_write(
            actor=actor,
            action="operation_cancel_at_provider",
            op=locked,
            reason=reason,
            detail={"provider_reference": op.provider_reference, "before_manual_failure": True},
        )

    try:
        obj = payment_cancel_outside_transaction(
            op,
            open_outcomes=(Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER),
            on_claim=audit,
        )
    except DomainError as exc:
        if exc.code != ErrorCode.WORKFLOW_HALTED:
            raise
        raise DomainError(
            ErrorCode.WORKFLOW_HALTED,
            f"The {operation_workflow(op.kind)} workflow is halted: "
            "the payment cannot be cancelled at the provider now, so it cannot be settled "
            "failed. Try again once the halt is cleared.",
            status=503,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            purchase=op.purchase_id,
            operation=op.id,
        ) from None
    if (
        obj is None
        and PaymentOperation.objects.filter(id=op.id)
        .exclude(outcome__in=(Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER))
        .exists()
    ):
        return  # settled meanwhile: the resolution's own check decides
    if obj is not None:
        operation_apply_observation(
            operation_id=op.id,
            obj=obj,
            source=Verification.PROVIDER,
            cause="cancel_before_manual_failure",
            actor=actor,
        )
        if outcome_from_object(obj, kind=op.kind) == Outcome.SUCCEEDED:
            _provider_contradicts(op, obj, Outcome.FAILED)
        if obj.canceled:
            return
    raise DomainError(
        ErrorCode.PROVIDER_CANCEL_FAILED,
        "The provider did not confirm cancelling this payment, so "
        "it cannot be settled failed yet (the buyer could still complete it). Try again.",
        status=409,
        retry=RetryAdvice.SAME_KEY,
        owner=Owner.SUPPORT,
        purchase=op.purchase_id,
        operation=op.id,
    )


def _operation_to_resolve(operation_id: str, *, outcome: str, reason: str) -> PaymentOperation:
    """The operation a person resolves, with a reason and an outcome a resolution takes."""
    if not (reason or "").strip():
        raise DomainError(ErrorCode.REASON_REQUIRED, "A reason is required.", status=422)
    if outcome not in (Outcome.SUCCEEDED, Outcome.FAILED):
        raise DomainError(
            ErrorCode.INVALID_OUTCOME, "outcome must be succeeded or failed.", status=422
        )
    op = (
        PaymentOperation.objects.select_related("purchase", "parent")
        .filter(id=operation_id)
        .first()
    )
    if op is None:
        raise DomainError(ErrorCode.NOT_FOUND, "No such operation.", status=404)
    return op


def _provider_read_before_resolution(
    op: PaymentOperation, *, outcome: str, reason: str, actor: str
) -> CallResult:
    """Steps 1 and 2 (no transaction open): the provider's record read back and judged
    against the person's `outcome` — applied and the resolution refused when it
    contradicts, the resolution refused while the provider still moves the money, a
    payment the provider holds open cancelled before a `failed`. The read, for the
    record."""
    read = _read_back(op)
    obj = read.object if read.classification == Classification.OK else None
    if obj is not None and _mismatch(op, obj):
        obj = None  # not this operation's record: no evidence either way
    if obj is not None and created_unconfirmed_adopt(op, obj):
        op.provider_reference = obj.id  # found by metadata: judged (and cancelled) by its id
    verdict = outcome_from_object(obj, kind=op.kind) if obj is not None else None
    if verdict in (Outcome.SUCCEEDED, Outcome.FAILED):
        assert obj is not None  # the verdict was read from it
        operation_apply_observation(
            operation_id=op.id,
            obj=obj,
            source=Verification.PROVIDER,
            cause="readback_before_resolution",
            actor=actor,
        )
        if verdict != outcome:
            _provider_contradicts(op, obj, outcome)
    elif (
        outcome == Outcome.SUCCEEDED and obj is not None and shows_no_money_moved(obj, kind=op.kind)
    ):
        # The provider's own record shows no money moved (a confirm it never applied, a
        # buyer who never authenticated, a capture or void the provider never applied): a
        # person's "succeeded" is contradicted, and accepting it would book a sale, a
        # capture or a void the provider never made.
        _provider_contradicts(op, obj, outcome)
    elif outcome == Outcome.SUCCEEDED and refund_never_received(op, read):
        # A refund the provider never received (its send refused, e.g. 409 key in use):
        # the readable provider holds no refund of this operation, and past the in-flight
        # window it will not. A person's "succeeded" would book money back that never
        # left (the same rule as for charges).
        raise DomainError(
            ErrorCode.PROVIDER_CONTRADICTS,
            "The provider's record contradicts 'succeeded': it "
            "holds no refund of this operation, so no money moved. The resolution was not "
            "applied.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.SUPPORT,
            purchase=op.purchase_id,
            operation=op.id,
            extra={"provider": {"object": "refund", "id": "", "status": "not_found"}},
        )
    elif (
        outcome == Outcome.FAILED
        and obj is not None
        and (op.kind in PAYMENT_KINDS or op.kind == OperationKind.REFUND)
        and obj.money_in_flight
    ):
        # The provider is still moving the money (a PaymentIntent `processing`, an x402
        # transfer broadcast but not yet mined, a refund or transfer back on its way) and
        # may yet succeed; a "failed" now invites a retry that charges twice — or a second
        # refund that pays back twice — once the first settles.
        raise DomainError(
            ErrorCode.PROVIDER_PROCESSING,
            f"The provider shows {obj.object_type} {obj.id} as "
            "'processing': it may still succeed, so it cannot be settled failed. Wait for "
            "the provider's answer.",
            status=409,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.RECONCILIATION,
            purchase=op.purchase_id,
            operation=op.id,
            extra={"provider": {"object": obj.object_type, "id": obj.id, "status": obj.status}},
        )
    elif (
        outcome == Outcome.FAILED
        and op.kind in PAYMENT_KINDS
        and op.provider_reference
        and (op.outcome == Outcome.AWAITING_BUYER or (obj is not None and obj.cancellable))
    ):
        _cancel_before_manual_failure_outside_transaction(op, actor=actor, reason=reason)
    return read


def _settle_on_a_persons_word_locked(
    purchase: Purchase,
    op: PaymentOperation,
    *,
    outcome: str,
    reason: str,
    actor: str,
    read: CallResult,
) -> None:
    """No provider evidence settled it: the person's outcome, graded `acknowledged`,
    verification `manual`, read back from the provider on the acknowledged schedule."""
    outcome_apply_locked(
        purchase,
        op,
        Outcome(outcome),
        grade=Grade.ACKNOWLEDGED,
        verification=Verification.MANUAL,
        cause="manual_resolution",
        actor=actor,
        evidence={"reason": reason, "provider_read": read.classification},
        reason=Reason.MANUAL if outcome == Outcome.FAILED else "",
    )
    # The person's word stands until the provider can be read back.
    op.reconcile_attempts = 0
    _schedule_acknowledged_read_back(op)


def operation_resolve_manual(
    *,
    operation_id: str,
    outcome: str,
    reason: str,
    actor: str,
    acting_user: User | None = None,
    acting_client: ApiClient | None = None,
    bind: Callable[[PaymentOperation], object] | None = None,
    audit: bool = True,
) -> PaymentOperation:
    """A person settles what machines could not — after the provider was asked.

    1. read back (no transaction open): a provider record that contradicts `outcome`
       is applied and the resolution refused (409 `provider_contradicts`); one that agrees
       settles it `confirmed`; no reachable record leaves the person's word, graded
       `acknowledged`, verification `manual`;
    2. `failed` for a payment the provider still holds open (awaiting the buyer, never
       confirmed) cancels it at the provider first, audited, refused if the cancel fails;
    3. one transaction records the Resolution and audit row (and `bind(op)`, the caller's
       idempotency binding) with the outcome.
    `audit=False`: the caller writes this action's one audit row in the same transaction.
    """
    assert_outside_transaction()
    op = _operation_to_resolve(operation_id, outcome=outcome, reason=reason)
    _refuse_unresolvable(op, acting_client=acting_client, acting_user=acting_user)
    read = _provider_read_before_resolution(op, outcome=outcome, reason=reason, actor=actor)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        evidence_applied = op.is_terminal
        if op.is_terminal and op.outcome != outcome:
            # settled meanwhile by other evidence that says otherwise
            raise DomainError(
                ErrorCode.PROVIDER_CONTRADICTS,
                f"The provider's record shows this "
                f"operation {op.outcome}; the resolution was not applied.",
                status=409,
                owner=Owner.SUPPORT,
                operation=op.id,
                purchase=purchase.id,
            )
        if not evidence_applied:
            _refuse_unresolvable(op, acting_client=acting_client, acting_user=acting_user)
            _settle_on_a_persons_word_locked(
                purchase, op, outcome=outcome, reason=reason, actor=actor, read=read
            )
        Resolution.objects.create(
            operation_id=op.id, purchase_id=purchase.id, outcome=outcome, reason=reason, actor=actor
        )
        if audit:
            operation_audit_write(
                actor=actor,
                action="operation_resolve",
                op=op,
                reason=reason,
                detail={
                    "outcome": outcome,
                    "grade": op.grade,
                    "provider_read": read.classification,
                },
            )
        if bind is not None:
            bind(op)
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def operation_overturn_review(*, operation_id: str, actor: str, reason: str) -> PaymentOperation:
    """A person has looked at what followed an overturn: the queue item closes."""
    if not (reason or "").strip():
        raise DomainError(ErrorCode.REASON_REQUIRED, "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        if (
            op.next_action_owner != Owner.SUPPORT
            or not op.transitions.filter(
                cause__in=(OVERTURN_CAUSE, "x402_transfer_reversed")
            ).exists()
        ):
            raise DomainError(
                ErrorCode.NOT_OVERTURNED,
                "This operation has no overturn waiting for review.",
                status=409,
                owner=Owner.NONE,
                operation=op.id,
                purchase=purchase.id,
            )
        op.next_action_owner = (
            Owner.BUYER if op.outcome == Outcome.FAILED and op.kind in PAYMENT_KINDS else Owner.NONE
        )
        op.save(update_fields=["next_action_owner", "updated_at"])
        transition_record(
            purchase_id=purchase.id,
            operation=op,
            field="outcome",
            source=op.outcome,
            target=op.outcome,
            cause="overturn_reviewed",
            evidence={"reason": reason},
            actor=actor,
        )
        operation_audit_write(actor=actor, action="overturn_review", op=op, reason=reason)
    return op
