"""Money the provider moved without Verity (writes): external linked operations.

A verified refund, capture or cancel that no Verity
operation requested (someone used the provider's dashboard) is recorded as a linked
PaymentOperation with `origin = provider`, created already settled by the evidence, so
the purchase status, the refundable amount, holds, ledger and settlement comparison stay
true. It goes through the same settle effects as Verity's own operations (holds, status,
OPERATION_SETTLED -> ledger), is audited as "made outside Verity" and waits in a queue
until a person reviews it. It is quarantined only when its amounts or references
disagree with Verity's books.

Lock order: Purchase -> PaymentOperation (payments.locks).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..enums import (
    PAYMENT_KINDS,
    SLOT_HOLDING_OUTCOMES,
    CallPurpose,
    CallStep,
    Grade,
    OperationKind,
    Origin,
    Outcome,
    Owner,
    Stage,
    Verification,
)
from ..errors import DomainError, ErrorCode
from ..locks import (
    assert_outside_transaction,
    lock_purchase_and_operation,
)
from ..models import PaymentOperation, ProviderCall, Purchase
from ..providers.base import ProviderObject, payment_provider
from .common import (
    operation_audit_write,
    payment_refund_room,
    payment_unsettled,
    provider_for,
    transition_record,
)
from .observations import _schedule_reconcile, _settle_effects
from .operations import operation_insert_guarded

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger("verity.payments.external")

EXTERNAL_AUDIT_REASON = "made outside Verity"


class ExternalResult(str, Enum):
    RECORDED = "recorded"
    KNOWN = "known"  # Verity already has an operation for this provider object
    NOT_EXTERNAL = "not_external"  # not (yet) judged here: held or left to the matching
    NOTHING_MOVED = "nothing_moved"  # a failed/canceled refund at the provider
    MISMATCH = "mismatch"


@dataclass(frozen=True)
class ExternalApplyResult:
    result: ExternalResult
    reason: str = ""
    operation_id: str = ""
    purchase_id: str = ""


def _expected_account(payment: PaymentOperation) -> str:
    return payment.provider_account or getattr(settings, "STRIPE_ACCOUNT", "") or ""


def _refund_room(payment: PaymentOperation) -> int:
    """What the provider can still refund of this one payment, as Verity's confirmed
    record has it: the one room function (payments.services.common), counting only
    succeeded refunds: a refund the provider made is a fact, judged against what Verity
    knows moved, not against refunds still in flight. Per payment, not per purchase: a
    duplicate charge and its compensating refund belong to the duplicate (found by the
    lifecycle machine: the purchase-wide sum quarantined a dashboard refund of either as
    `mismatch:amount`)."""
    # A chargeback does not shrink it: the bank's hold limits what Verity may ask for, but a
    # refund the provider made moved money all the same (the chaos soak's dashboard refunded
    # a disputed charge; judged net of the chargeback, it was quarantined as a mismatch).
    return payment_refund_room(payment, counted=(Outcome.SUCCEEDED,), net_of_chargebacks=False)


def _record_locked(
    purchase: Purchase,
    payment: PaymentOperation,
    *,
    kind: str,
    obj: ProviderObject,
    amount: int,
    verification: str,
    cause: str,
    actor: str,
    pending: bool = False,
) -> PaymentOperation:
    """Created already settled by the evidence; or, for a refund the provider is still
    processing, `awaiting_provider` (it holds the purchase's slot like any refund in
    flight and the reconciler reads it back by its id)."""
    now = timezone.now()
    settled = {
        "outcome": Outcome.SUCCEEDED,
        "stage": Stage.SETTLED,
        "grade": Grade.CONFIRMED,
        "verification": verification,
        "settled_at": now,
    }
    if pending:
        settled = {
            "outcome": Outcome.AWAITING_PROVIDER,
            "stage": Stage.RECONCILING,
            "verification": verification,
        }
    op = operation_insert_guarded(
        purchase=purchase,
        kind=kind,
        amount=amount,
        currency=payment.currency,
        parent=payment,
        provider_reference=obj.id,
        provider_charge=obj.latest_charge or payment.provider_charge,
        provider_account=payment.provider_account,
        origin=Origin.PROVIDER,
        provider_status=obj.status,
        next_action_owner=Owner.SUPPORT,
        is_compensation=False,
        **settled,
    )
    if pending:
        _schedule_reconcile(op, first=True)
    transition_record(
        purchase_id=purchase.id,
        operation=op,
        field="outcome",
        source="",
        target=op.outcome,
        cause=cause[:64],
        evidence={**obj.safe_fields(), "origin": Origin.PROVIDER.value},
        actor=actor,
    )
    _settle_effects(purchase, op, cause=cause[:64], actor=actor)
    operation_audit_write(
        actor="provider",
        action="external_operation_recorded",
        op=op,
        reason=EXTERNAL_AUDIT_REASON,
        detail={
            "kind": kind,
            "provider_reference": obj.id,
            "amount": amount,
            "currency": op.currency,
            "evidence": cause[:64],
        },
    )
    log.warning(
        "external %s recorded op=%s purchase=%s reference=%s amount=%s",
        kind,
        op.id,
        purchase.id,
        obj.id,
        amount,
    )
    return op


def _busy(purchase: Purchase) -> bool:
    busy: bool = purchase.operations.filter(outcome__in=SLOT_HOLDING_OUTCOMES).exists()
    return busy


def _own_record_unsettled(
    purchase: Purchase, payment: PaymentOperation, refund: ProviderObject
) -> str:
    """Why Verity cannot judge this refund yet, or "" when its own record is settled: the
    payment not terminal, a person's "failed" not yet confirmed by the provider's read-back,
    or (the refund exceeding what is captured) a capture still in flight."""
    if payment_unsettled(payment):
        return "payment_not_settled"
    if (
        payment.outcome == Outcome.SUCCEEDED
        and refund.amount > _refund_room(payment)
        and (
            PaymentOperation.objects.filter(parent=payment, kind=OperationKind.CAPTURE)
            .exclude(outcome__in=(Outcome.SUCCEEDED, Outcome.FAILED))
            .exists()
        )
    ):
        return "capture_not_settled"
    return ""


def external_refund_record(
    *,
    payment_operation_id: str,
    refund: ProviderObject,
    verification: str,
    cause: str,
    actor: str = "",
) -> ExternalApplyResult:
    """A Refund at the provider that no Verity operation requested (it carries no
    `operation_id` metadata and no operation holds its id)."""
    with transaction.atomic():
        purchase, payment = lock_purchase_and_operation(payment_operation_id)
        ids = {"operation_id": payment.id, "purchase_id": purchase.id}
        known = PaymentOperation.objects.filter(
            kind=OperationKind.REFUND, provider_reference=refund.id
        ).first()
        if known is not None:
            return ExternalApplyResult(ExternalResult.KNOWN, "", known.id, purchase.id)
        why = ""
        if refund.object_type != "refund":
            why = "object"
        elif (refund.account or "") != _expected_account(payment):
            why = "account"
        elif refund.payment_intent and refund.payment_intent != payment.provider_reference:
            why = "reference"
        elif refund.currency.lower() != payment.currency.lower():
            why = "currency"
        elif payment.kind not in PAYMENT_KINDS:
            why = "payment_not_succeeded"
        if why:
            return ExternalApplyResult(ExternalResult.MISMATCH, why, **ids)
        waiting = _own_record_unsettled(purchase, payment, refund)
        if waiting:
            # The provider refunded money Verity has not confirmed it holds yet (its answer
            # was lost, a person's word awaits read-back, a capture is in flight): the refund
            # is real, so the event waits for Verity's record instead of being judged now.
            return ExternalApplyResult(ExternalResult.NOT_EXTERNAL, waiting, **ids)
        if payment.outcome != Outcome.SUCCEEDED:
            return ExternalApplyResult(ExternalResult.MISMATCH, "payment_not_succeeded", **ids)
        if refund.refund_returned_nothing:
            # no money left: nothing to record (a later event cannot revive it)
            return ExternalApplyResult(
                ExternalResult.NOTHING_MOVED, f"refund_{refund.status}", **ids
            )
        pending = refund.refund_in_flight
        if not refund.succeeded and not pending:
            return ExternalApplyResult(ExternalResult.MISMATCH, "status", **ids)
        if refund.amount <= 0 or refund.amount > _refund_room(payment):
            return ExternalApplyResult(ExternalResult.MISMATCH, "amount", **ids)
        if pending and _busy(purchase):
            # Another operation holds the slot: hold the event, retry after it settles.
            return ExternalApplyResult(ExternalResult.NOT_EXTERNAL, "purchase_busy", **ids)
        op = _record_locked(
            purchase,
            payment,
            kind=OperationKind.REFUND,
            obj=refund,
            amount=refund.amount,
            verification=verification,
            cause=cause,
            actor=actor,
            pending=pending,
        )
    return ExternalApplyResult(ExternalResult.RECORDED, "", op.id, purchase.id)


def external_intent_move_record(
    *,
    payment_operation_id: str,
    obj: ProviderObject,
    verification: str,
    cause: str,
    actor: str = "",
) -> ExternalApplyResult:
    """An authorization captured (`succeeded`) or cancelled (`canceled`) at the provider
    with no Verity capture/void asking for it."""
    with transaction.atomic():
        purchase, payment = lock_purchase_and_operation(payment_operation_id)
        ids = {"operation_id": payment.id, "purchase_id": purchase.id}
        if (
            payment.kind != OperationKind.AUTHORIZE
            or payment.outcome != Outcome.SUCCEEDED
            or not (obj.succeeded or obj.canceled)
        ):
            return ExternalApplyResult(ExternalResult.NOT_EXTERNAL, "", **ids)
        children = purchase.operations.filter(
            parent=payment, kind__in=[OperationKind.CAPTURE, OperationKind.VOID]
        )
        if children.exclude(outcome=Outcome.FAILED).exists() or _busy(purchase):
            # Verity's own capture/void (or something still in flight) explains it: the
            # ordinary matching judges the event.
            return ExternalApplyResult(ExternalResult.NOT_EXTERNAL, "verity_operation", **ids)
        why = ""
        if (obj.account or "") != _expected_account(payment):
            why = "account"
        elif obj.id != payment.provider_reference:
            why = "reference"
        elif obj.currency.lower() != payment.currency.lower():
            why = "currency"
        elif obj.amount != payment.amount:
            why = "amount"
        elif obj.metadata.get("purchase_id") not in (None, purchase.id):
            why = "purchase"
        if why:
            return ExternalApplyResult(ExternalResult.MISMATCH, why, **ids)
        kind = OperationKind.CAPTURE if obj.succeeded else OperationKind.VOID
        op = _record_locked(
            purchase,
            payment,
            kind=kind,
            obj=obj,
            amount=payment.amount,
            verification=verification,
            cause=cause,
            actor=actor,
        )
    return ExternalApplyResult(ExternalResult.RECORDED, "", op.id, purchase.id)


def external_intent_read(*, payment_operation_id: str, cause: str) -> ExternalApplyResult | None:
    """Read an authorization back at the provider (no transaction open) and record a
    capture or cancel made there with no Verity operation asking for it: a capture that
    met an authorization cancelled in the dashboard (no event, or a lost one) learns that
    the hold is gone, so the purchase is voided and its goods unwind like after Verity's
    own void. A read that fails changes nothing (absence of evidence). None when there is
    nothing to read."""
    assert_outside_transaction()
    payment = PaymentOperation.objects.get(id=payment_operation_id)
    if (
        payment.kind != OperationKind.AUTHORIZE
        or payment.outcome != Outcome.SUCCEEDED
        or not payment.provider_reference
    ):
        return None
    result = payment_provider(provider_for(payment)).retrieve_payment_intent(
        payment.provider_reference
    )
    obj = result.object
    ProviderCall.objects.create(
        operation_id=payment.id,
        purpose=CallPurpose.RECONCILE,
        step=CallStep.RETRIEVE,
        request_id=result.request_id[:100],
        http_status=result.http_status,
        classification=result.classification,
        error_code=result.error_code[:64],
        fault_drill=result.fault_drill,
        safe_fields=obj.safe_fields()
        if obj
        else {"object": "payment_intent", "id": payment.provider_reference},
        finished_at=timezone.now(),
    )
    if obj is None:
        return None
    return external_intent_move_record(
        payment_operation_id=payment.id,
        obj=obj,
        verification=Verification.PROVIDER,
        cause=cause,
        actor="authorization-readback",
    )


def external_refunds_read(*, payment_operation_id: str) -> list[ExternalApplyResult]:
    """Read a payment's refunds at the provider (no transaction open) and record the ones
    no Verity operation requested. Prompted by `charge.refunded`, whose Charge does not
    name its refunds. Refunds carrying Verity's `operation_id` are the reconciler's."""

    assert_outside_transaction()
    payment = PaymentOperation.objects.get(id=payment_operation_id)
    if not payment.provider_reference:
        return []
    call, refunds = payment_provider(provider_for(payment)).list_refunds_for_intent(
        payment.provider_reference
    )
    out = []
    for refund in refunds:
        if refund.metadata.get("operation_id"):
            continue
        out.append(
            external_refund_record(
                payment_operation_id=payment.id,
                refund=refund,
                verification=Verification.PROVIDER,
                cause="readback:refunds",
                actor="external-refunds-readback",
            )
        )
    return out


def external_operation_review(
    *, operation_id: str, acting_user: User, reason: str
) -> PaymentOperation:
    """A person has seen an operation made outside Verity (audited, same transaction)."""
    if not (reason or "").strip():
        raise DomainError(
            ErrorCode.REASON_REQUIRED, "A reason is required.", status=422, owner=Owner.SUPPORT
        )
    with transaction.atomic():
        try:
            _, op = lock_purchase_and_operation(operation_id)
        except PaymentOperation.DoesNotExist:
            raise DomainError(ErrorCode.NOT_FOUND, "No such operation.", status=404) from None
        if op.origin != Origin.PROVIDER:
            raise DomainError(
                ErrorCode.NOT_EXTERNAL,
                "This operation was made by Verity.",
                status=409,
                operation=op.id,
                purchase=op.purchase_id,
                owner=Owner.SUPPORT,
            )
        if op.reviewed_at is not None:
            raise DomainError(
                ErrorCode.ALREADY_REVIEWED,
                "Already reviewed.",
                status=409,
                operation=op.id,
                purchase=op.purchase_id,
                owner=Owner.NONE,
            )
        op.reviewed_at = timezone.now()
        op.reviewed_by = acting_user.get_username()[:150]
        op.next_action_owner = Owner.NONE
        op.save(update_fields=["reviewed_at", "reviewed_by", "next_action_owner", "updated_at"])
        operation_audit_write(
            actor=acting_user.get_username(),
            action="external_operation_review",
            op=op,
            reason=reason,
            detail={"kind": op.kind, "provider_reference": op.provider_reference},
        )
    return op
