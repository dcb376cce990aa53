"""Cancelling a payment at the provider so nobody can complete it later: before a person
settles it `failed` (payments.services.manual), and after Verity settled it `failed` on the
provider's word while the provider still holds it open (a declined 3-D Secure leaves the
PaymentIntent `requires_payment_method`: anyone holding the secret key could attach a card
and confirm it, a charge with no order).

One write, in the three phases (docs/reliability.md#rules-every-money-movement-obeys):
claim the `cancel` step under the locks, send it outside any transaction under the step
key `<key>:cancel` (the same key on every attempt: the provider answers a repeat with its
first answer), and let the caller apply what the provider answered.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError, transaction

from ..enums import CallPurpose, CallStep, Classification, Outcome, Owner, RetryAdvice, Verification
from ..errors import DomainError, ErrorCode
from ..locks import assert_outside_transaction, lock_purchase_and_operation
from ..models import PaymentOperation, ProviderCall
from ..providers.base import ProviderObject, payment_provider
from .common import (
    _halted,
    _record_call,
    log,
    operation_workflow,
    provider_for,
    transition_record,
)
from .observations import _mismatch, operation_apply_observation, payment_cancel_due
from .reconcile import _read_back


def payment_cancel_outside_transaction(
    op: PaymentOperation,
    *,
    open_outcomes: tuple[str, ...],
    on_claim: Callable[[PaymentOperation], None],
) -> ProviderObject | None:
    """Claim and send the cancel of `op`'s PaymentIntent; the provider's record of it
    afterwards (the cancel's answer, else a read-back), or None when unreadable or not
    this operation's.

    Phase 1 locks the purchase and the operation, returns None (nothing claimed) when the
    operation is no longer in `open_outcomes`, refuses while its workflow is halted (a
    cancel is a write: it honours the halt like every dispatch; nothing is claimed), and
    records the claim (a ProviderCall) and `on_claim(op)` (an audit row, a history row) in
    one transaction. Raises DomainError `cancel_in_progress` when a concurrent cancel
    claimed the same attempt."""
    assert_outside_transaction()
    ref = op.provider_reference
    with transaction.atomic():
        purchase, locked = lock_purchase_and_operation(op.id)
        if locked.outcome not in open_outcomes:
            return None
        workflow = operation_workflow(locked.kind)
        if _halted(workflow):
            raise DomainError(
                ErrorCode.WORKFLOW_HALTED,
                f"The {workflow} workflow is halted: the payment cannot "
                "be cancelled at the provider now. Try again once the halt is cleared.",
                status=503,
                retry=RetryAdvice.SAME_KEY,
                owner=Owner.SUPPORT,
                purchase=op.purchase_id,
                operation=op.id,
            )
        attempt = (
            ProviderCall.objects.filter(
                operation=locked, purpose=CallPurpose.DISPATCH, step=CallStep.CANCEL
            ).count()
            + 1
        )
        try:
            with transaction.atomic():
                call = ProviderCall.objects.create(
                    operation=locked,
                    purpose=CallPurpose.DISPATCH,
                    step=CallStep.CANCEL,
                    attempt=attempt,
                    key=locked.provider_key(CallStep.CANCEL),
                )
        except IntegrityError:
            raise DomainError(
                ErrorCode.CANCEL_IN_PROGRESS,
                "Another cancel of this payment is in progress.",
                status=409,
                purchase=op.purchase_id,
                operation=op.id,
                owner=Owner.SUPPORT,
            ) from None
        on_claim(locked)
    result = payment_provider(provider_for(op)).cancel_payment_intent(key=call.key, intent_id=ref)
    _record_call(call, result)
    obj = result.object
    if result.classification != Classification.OK or obj is None:
        read = _read_back(
            PaymentOperation.objects.select_related("purchase", "parent").get(id=op.id)
        )
        obj = read.object if read.classification == Classification.OK else None
    if obj is not None and _mismatch(op, obj):
        return None
    return obj


class CancelNotConfirmed(Exception):
    """The provider did not confirm the cancel (no answer, or still open): the outbox
    message backs off and the same key is sent again."""


def payment_cancel_after_failure(*, operation_id: str) -> None:
    """The outbox's follow-up of a payment settled failed that the provider still holds
    open: cancelled at the provider, so the buyer's declined attempt cannot be completed
    later with the secret key. Idempotent: a payment already cancelled, or no longer open,
    sends nothing."""
    op = (
        PaymentOperation.objects.select_related("purchase", "parent")
        .filter(id=operation_id)
        .first()
    )
    if op is None or not payment_cancel_due(op, None):
        return
    if op.provider_calls.filter(
        purpose=CallPurpose.DISPATCH, step=CallStep.CANCEL, classification=Classification.OK
    ).exists():
        return  # cancelled already (by a person, or an earlier run of this message)

    def history(locked: PaymentOperation) -> None:
        transition_record(
            purchase_id=locked.purchase_id,
            operation=locked,
            field="outcome",
            source=locked.outcome,
            target=locked.outcome,
            cause="cancel_after_failure",
            evidence={"provider_reference": locked.provider_reference},
            actor="system",
        )

    obj = payment_cancel_outside_transaction(op, open_outcomes=(Outcome.FAILED,), on_claim=history)
    if obj is None:
        raise CancelNotConfirmed(f"cancel of {op.id}: the provider could not be read")
    if obj.canceled or not obj.cancellable:
        # Cancelled, or past cancelling (the provider moved it on meanwhile): the record is
        # applied like any evidence; a payment completed after Verity's failure is a conflict
        # the read-back path reports.
        operation_apply_observation(
            operation_id=op.id,
            obj=obj,
            source=Verification.PROVIDER,
            cause="cancel_after_failure",
            actor="system",
        )
        if not obj.canceled:
            log.warning("cancel after failure: provider shows %s operation=%s", obj.status, op.id)
        return
    raise CancelNotConfirmed(f"cancel of {op.id}: the provider still shows {obj.status}")
