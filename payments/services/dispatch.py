"""Dispatch, in three phases: claim in a transaction (key persisted, hold reserved,
halt checked), call the provider outside any transaction, apply the outcome in a second
transaction.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..enums import (
    PAYMENT_KINDS,
    CallPurpose,
    CallStep,
    Classification,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    Reason,
    RetryAdvice,
    Verification,
)
from ..errors import ApplyResult, DomainError, ErrorCode
from ..locks import (
    assert_outside_transaction,
    lock_operation,
    lock_purchase_and_operation,
)
from ..models import PaymentOperation, ProviderCall
from ..providers.base import CallResult, PaymentProvider, payment_provider
from ..view_queries import operation_for_view
from .common import (
    CallAnswer,
    _halted,
    _op_to,
    _record_call,
    log,
    operation_workflow,
    payment_request,
    provider_for,
    provider_metadata,
    rail_evidence_for,
)
from .holds import _hold_reserve
from .observations import (
    _mismatch,
    _settle_without_object,
    operation_apply_observation,
    outcome_apply_locked,
)
from .reconcile import _past_inflight_window, _read_back, operation_reconcile

# Resend a not_sent step at most twice (docs/reliability.md#outcome-classification).
NOT_SENT_RESENDS = 2


RETRYABLE_RESENDS = 2


# A 429 / Stripe-Should-Retry answer is resent with the same key after a bounded,
# jittered backoff (base * 2^(n-1), capped), never in a tight loop.
RETRYABLE_BACKOFF_BASE_SECONDS = 0.5


RETRYABLE_BACKOFF_CAP_SECONDS = 2.0


class _HaltedAtClaim(Exception):
    """The operation's workflow is halted: the claim wrote nothing, it stays queued."""


class _StepTaken(Exception):
    """The step's claim row exists already (one claim per step): the claim rolls back whole."""


def _claim(
    operation_id: str,
    step: str,
    *,
    attempt: int = 1,
    from_pending: bool = False,
    confirm: bool = False,
    purchase_id: str = "",
) -> ProviderCall | None:
    """Phase 1. Returns the claimed ProviderCall, or None if someone else owns the step or
    the operation moved on (e.g. the dead-dispatch sweep settled it)."""
    try:
        return _claim_in_transaction(
            operation_id,
            step,
            attempt=attempt,
            from_pending=from_pending,
            confirm=confirm,
            purchase_id=purchase_id,
        )
    except _StepTaken:
        return None


def _claim_in_transaction(
    operation_id: str,
    step: str,
    *,
    attempt: int,
    from_pending: bool,
    confirm: bool,
    purchase_id: str,
) -> ProviderCall | None:
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id, purchase_id=purchase_id)
        if from_pending:
            if op.outcome != Outcome.PENDING:
                return None
            # A halt binds at claim time, under the lock
            # (docs/reliability.md#rules-every-money-movement-obeys): queued work of
            # every kind (a backstop, an approved refund, a compensation) waits here, still
            # `pending`, and goes out once the halt clears. It does not fail.
            if _halted(operation_workflow(op.kind)):
                raise _HaltedAtClaim(operation_workflow(op.kind))
            op.dispatch_deadline = timezone.now() + timedelta(
                seconds=settings.DISPATCH_LEASE_SECONDS
            )
            fields: tuple[str, ...] = ("dispatch_deadline",)
            if confirm:
                # The money step is claimed with the dispatch itself (the one-call payment,
                # an x402 settle): one UPDATE stores both.
                op.confirm_claimed_at = timezone.now()
                fields += ("confirm_claimed_at",)
            _op_to(op, "start_dispatch", cause=f"claim:{step}", actor="dispatcher", fields=fields)
            # A pending operation has no claimed step (its claims are made here, with the
            # move to dispatching, under the lock): the insert cannot meet another claim,
            # so it needs no savepoint. Were it to, the whole claim rolls back and raises.
            call = ProviderCall.objects.create(
                operation=op,
                purpose=CallPurpose.DISPATCH,
                step=step,
                attempt=attempt,
                key=op.provider_key(step),
            )
        elif op.outcome != Outcome.DISPATCHING:
            return None
        else:
            # Nothing is written before this insert (the locks only): a step claimed
            # already rolls the whole claim back, so the insert needs no savepoint.
            try:
                call = ProviderCall.objects.create(
                    operation=op,
                    purpose=CallPurpose.DISPATCH,
                    step=step,
                    attempt=attempt,
                    key=op.provider_key(step),
                )
            except IntegrityError as exc:
                raise _StepTaken from exc  # one claim per step: this step was already claimed
        if confirm or (from_pending and op.kind == OperationKind.REFUND):
            if not _hold_reserve(op):
                outcome_apply_locked(
                    purchase,
                    op,
                    Outcome.FAILED,
                    grade=Grade.CONFIRMED,
                    verification=Verification.UNVERIFIED,
                    cause="limit_at_claim",
                    actor="dispatcher",
                    evidence={},
                    reason="spending_limit_exceeded",
                )
                call.delete()
                if op.confirm_claimed_at is not None and from_pending:
                    # Refused before anything left: no money step was claimed after all.
                    PaymentOperation.objects.filter(id=op.id).update(confirm_claimed_at=None)
                return None
        if confirm and not from_pending:
            op.confirm_claimed_at = timezone.now()
            op.save(update_fields=["confirm_claimed_at", "updated_at"])
        return call


def operation_claim_write(*, operation_id: str, step: str) -> ProviderCall | None:
    """Phase 1 for a rail whose one write is made by its own service (x402 settle): the
    pending operation starts dispatching, the step is claimed once (one claim per step) and the
    hold reserved, in the caller's transaction."""
    return _claim(operation_id, step, from_pending=True, confirm=True)


def _send(
    operation_id: str, step: str, first_call: ProviderCall, fn: Callable[[], CallResult]
) -> CallResult:
    """Phase 2, outside any transaction. Resends the same step key only for answers that
    prove nothing was applied (not_sent, 429/should-retry), each resend claimed anew."""
    return _send_for_apply(operation_id, step, first_call, fn, applied_next=False)[0]


def _send_for_apply(
    operation_id: str,
    step: str,
    first_call: ProviderCall,
    fn: Callable[[], CallResult],
    *,
    applied_next: bool = True,
) -> tuple[CallResult, CallAnswer | None]:
    """`_send`, for a caller that applies the answer right after
    (`_outcome_after_call`): an answer with a provider object is left for the applying
    transaction to record (the CallAnswer returned), every other answer is recorded here."""
    call: ProviderCall | None
    call, attempt = first_call, 1
    while True:
        assert_outside_transaction()
        result = fn()
        if (
            applied_next
            and result.classification == Classification.OK
            and result.object is not None
        ):
            return result, CallAnswer(call, result)  # never resent: recorded by its apply
        _record_call(call, result)
        resend = (
            result.classification == Classification.NOT_SENT and attempt <= NOT_SENT_RESENDS
        ) or (result.classification == Classification.RETRYABLE and attempt <= RETRYABLE_RESENDS)
        if not resend:
            return result, None
        if result.classification == Classification.RETRYABLE:
            # Outside any transaction (phase 2), so the wait holds no lock.
            delay = min(
                RETRYABLE_BACKOFF_BASE_SECONDS * 2 ** (attempt - 1), RETRYABLE_BACKOFF_CAP_SECONDS
            )
            time.sleep(delay * (1 + random.random() * 0.1))
        attempt += 1
        call = _claim(operation_id, step, attempt=attempt)
        if call is None:
            return CallResult(Classification.IN_FLIGHT), None


def _outcome_after_call(
    op: PaymentOperation, step: str, result: CallResult, answer: CallAnswer | None = None
) -> None:
    """Phase 3 for a money-moving step's answer. `answer`: the call's answer when its
    applying transaction records it (`_send_for_apply`)."""
    cls = result.classification
    if cls == Classification.IN_FLIGHT:
        return
    if cls == Classification.OK and result.object is not None:
        applied = operation_apply_observation(
            operation_id=op.id,
            obj=result.object,
            source=Verification.PROVIDER,
            cause=f"{step}_answer",
            purchase_id=op.purchase_id,
            answer=answer,
        )
        if applied == ApplyResult.APPLIED:
            return  # it left `dispatching` (an applied answer always moves the outcome)
        current = PaymentOperation.objects.values_list("outcome", flat=True).get(id=op.id)
        if applied == ApplyResult.MISMATCH or current == Outcome.DISPATCHING:
            _settle_without_object(
                op.id,
                Outcome.UNKNOWN,
                reason="",
                cause=f"{step}_no_verdict",
                evidence=result.object.safe_fields(),
            )
        return
    if cls == Classification.DECLINED:
        if result.object is not None:
            operation_apply_observation(
                operation_id=op.id,
                obj=result.object,
                source=Verification.PROVIDER,
                cause=f"{step}_declined",
            )
        current = PaymentOperation.objects.values_list("outcome", flat=True).get(id=op.id)
        if current == Outcome.DISPATCHING:
            _settle_without_object(
                op.id,
                Outcome.FAILED,
                reason=Reason.CARD_DECLINED,
                cause=f"{step}_declined",
                verification=Verification.PROVIDER,
                evidence={"http_status": result.http_status, "code": result.error_code},
            )
        return
    if cls in (Classification.NOT_SENT, Classification.RETRYABLE):
        # Provably not applied, resends exhausted: fail with evidence (retry: new_operation).
        _settle_without_object(
            op.id,
            Outcome.FAILED,
            reason=Reason.PROVIDER_UNREACHABLE,
            cause=f"{step}_{cls}",
            evidence={"classification": cls},
        )
        return
    if cls == Classification.REJECTED:
        # A 4xx on a non-create step: the object decides (e.g. a second confirm is a bare
        # 400 at localstripe, yet the first may have succeeded).
        read = _read_back(PaymentOperation.objects.get(id=op.id))
        if read.classification == Classification.OK and read.object is not None:
            operation_apply_observation(
                operation_id=op.id,
                obj=read.object,
                source=Verification.PROVIDER,
                cause=f"{step}_readback",
            )
        current = PaymentOperation.objects.values_list("outcome", flat=True).get(id=op.id)
        if (
            current == Outcome.DISPATCHING
            and step == CallStep.REFUND
            and read.classification == Classification.NOT_FOUND
        ):
            # The provider refused the refund (already refunded, disputed, ...) and a
            # readable provider holds no refund of this operation: nothing moved, and the
            # refusal is the provider's own statement. `failed` with its reason frees the
            # purchase's slot; `unknown` held it for ever
            # (docs/reliability.md#outcome-classification).
            _settle_without_object(
                op.id,
                Outcome.FAILED,
                reason=Reason.PROVIDER_REFUSED,
                cause=f"{step}_refused",
                verification=Verification.PROVIDER,
                evidence={"http_status": result.http_status, "code": result.error_code},
            )
        elif current == Outcome.DISPATCHING:
            _settle_without_object(
                op.id,
                Outcome.UNKNOWN,
                reason="",
                cause=f"{step}_rejected_no_verdict",
                evidence={"http_status": result.http_status},
            )
        return
    _settle_without_object(
        op.id,
        Outcome.UNKNOWN,
        reason="",
        cause=f"{step}_{cls}",
        evidence={
            "http_status": result.http_status,
            "fault_drill": result.fault_drill,
            "detail": result.detail,
        },
    )


_metadata = provider_metadata


def payment_money_step(op: PaymentOperation) -> str:
    """The step of a card payment that can move money: `pay` (create with confirm=true)
    where the rail's provider dedupes keys, else `confirm`. What a fault drill arms."""
    return (
        CallStep.PAY if payment_provider(provider_for(op)).pays_in_one_call() else CallStep.CONFIRM
    )


def _dispatch_payment_one_call(op: PaymentOperation, provider: PaymentProvider) -> None:
    """One round trip (
    docs/reliability.md#one-round-trip-where-the-provider-dedupes-keys). The claim stores the step
    key and, as `confirm_claimed_at`, the
    time of the first send before anything leaves: from then on money may have moved, so a
    dead worker is swept to `unknown`, never to `failed`. A lost answer is asked again
    under the same key (the reconciler, at once below and on its schedule), found by the
    signed webhook (metadata) or read by metadata — never created again under another key.
    """
    call = _claim(op.id, CallStep.PAY, from_pending=True, confirm=True, purchase_id=op.purchase_id)
    if call is None:
        return
    payment_send_claimed(op, call, provider)


def payment_send_claimed(
    op: PaymentOperation, call: ProviderCall, provider: PaymentProvider | None = None
) -> None:
    """Phases 2 and 3 of a one-call payment whose claim (`call`) is committed: by the claim
    above, or by the transaction that created it claimed
    (payments.services.operations.payment_create_claimed)."""
    assert_outside_transaction()
    provider = provider or payment_provider(provider_for(op))
    key = op.provider_key(CallStep.PAY)
    request = payment_request(op)
    result, answer = _send_for_apply(
        op.id,
        CallStep.PAY,
        call,
        lambda: provider.create_and_confirm_payment_intent(key=key, **request),
    )
    if result.classification == Classification.REJECTED:
        # A 4xx on create refuses the request before it executes: nothing was charged
        # and the provider keeps no answer under the key (a refusal is not stored by Stripe).
        _settle_without_object(
            op.id,
            Outcome.FAILED,
            reason=Reason.INVALID_REQUEST,
            cause="pay_rejected",
            verification=Verification.PROVIDER,
            evidence={"http_status": result.http_status, "code": result.error_code},
        )
        return
    _outcome_after_call(op, CallStep.PAY, result, answer)
    if result.classification == Classification.UNKNOWN and result.http_status != 409:
        # The answer was lost, or told nothing: ask once more now, under the same key, so
        # the buyer hears the provider's own answer instead of "unknown". A 409 is the
        # first request still running there: the schedule asks later.
        try:
            operation_reconcile(operation_id=op.id, actor="dispatcher")
        except DomainError:
            pass  # settled meanwhile (the webhook, another reconcile): nothing to ask


# A create answered with these made no PaymentIntent: refused, declined, or provably
# never applied (never sent, rate limited).
_CREATE_REFUSED = (
    Classification.DECLINED,
    Classification.REJECTED,
    Classification.NOT_SENT,
    Classification.RETRYABLE,
)


def _created_found(op: PaymentOperation) -> CallResult | None:
    """After a create whose answer was lost: the provider's PaymentIntent of this operation
    (read by its metadata) as the create's answer, to confirm as if it had arrived.

    None when the operation was settled here instead
    (docs/reliability.md#create-then-claim-then-confirm): `unknown` while a PaymentIntent
    may exist (unreadable, or none found yet inside the provider's in-flight window), so
    the purchase stays busy and no second payment is made beside one that is payable with
    the secret key, until the read-back cancels it or finds none. A complete read that
    finds none past the in-flight window is returned as a create that made nothing."""
    read = _read_back(op)
    if read.classification == Classification.OK and read.object is not None:
        if read.object.confirm_unapplied and not _mismatch(op, read.object):
            return read  # adopted: its id is stored and it is confirmed below
        # Moved on without Verity (confirmed, cancelled) or not this operation's: the
        # read-back judges it.
        operation_apply_observation(
            operation_id=op.id,
            obj=read.object,
            source=Verification.PROVIDER,
            cause="create_readback",
            purchase_id=op.purchase_id,
        )
    current = PaymentOperation.objects.values_list("outcome", flat=True).get(id=op.id)
    if current != Outcome.DISPATCHING:
        return None
    if read.classification == Classification.NOT_FOUND and _past_inflight_window(op):
        return CallResult(Classification.UNKNOWN, detail="no payment intent of this operation")
    _settle_without_object(
        op.id,
        Outcome.UNKNOWN,
        reason="",
        cause="create_no_answer",
        evidence={"read_back": read.classification},
    )
    return None


def _dispatch_payment(op: PaymentOperation) -> None:
    provider = payment_provider(provider_for(op))
    if provider.pays_in_one_call():
        _dispatch_payment_one_call(op, provider)
        return
    call = _claim(op.id, CallStep.CREATE, from_pending=True, purchase_id=op.purchase_id)
    if call is None:
        return
    result = _send(
        op.id,
        CallStep.CREATE,
        call,
        lambda: provider.create_payment_intent(
            key=op.provider_key(CallStep.CREATE),
            amount=op.amount,
            currency=op.currency,
            payment_method=op.payment_method,
            capture_method=op.capture_method,
            metadata=_metadata(op),
        ),
    )
    if result.classification == Classification.IN_FLIGHT:
        return
    if result.classification not in _CREATE_REFUSED and (
        result.classification != Classification.OK or result.object is None
    ):
        # The answer was lost (timeout, reset, 5xx, 409): the provider may hold a
        # PaymentIntent of this operation, waiting for a confirm. Find it, and confirm
        # that one; never create another beside it.
        found = _created_found(op)
        if found is None:
            return
        result = found
    if result.classification != Classification.OK or result.object is None:
        # Create never moves money and confirm was never claimed: whatever happened, this
        # operation cannot have charged (docs/reliability.md#create-then-claim-then-confirm).
        reason = {
            Classification.DECLINED: Reason.CARD_DECLINED,
            Classification.REJECTED: Reason.INVALID_REQUEST,
            Classification.NOT_SENT: Reason.PROVIDER_UNREACHABLE,
            Classification.RETRYABLE: Reason.PROVIDER_UNREACHABLE,
        }.get(result.classification, Reason.NOT_CONFIRMED)
        _settle_without_object(
            op.id,
            Outcome.FAILED,
            reason=reason,
            cause="create_failed",
            evidence={"classification": result.classification, "http_status": result.http_status},
        )
        return
    with transaction.atomic():
        locked = lock_operation(op.id)
        if _mismatch(locked, result.object) in ("", "provider reference"):
            locked.provider_reference = result.object.id
            locked.save(update_fields=["provider_reference", "updated_at"])
    call = _claim(op.id, CallStep.CONFIRM, confirm=True, purchase_id=op.purchase_id)
    if call is None:
        return
    intent_id = result.object.id
    result, answer = _send_for_apply(
        op.id,
        CallStep.CONFIRM,
        call,
        lambda: provider.confirm_payment_intent(
            key=op.provider_key(CallStep.CONFIRM), intent_id=intent_id
        ),
    )
    _outcome_after_call(op, CallStep.CONFIRM, result, answer)


_LINKED_STEP: dict[str, str] = {
    OperationKind.CAPTURE: CallStep.CAPTURE,
    OperationKind.VOID: CallStep.CANCEL,
    OperationKind.REFUND: CallStep.REFUND,
}


def _dispatch_linked(op: PaymentOperation) -> None:
    evidence = rail_evidence_for(op.rail)
    if evidence is not None and op.kind == OperationKind.REFUND:
        evidence.refund_send(op)  # the rail's own send (x402: a transfer back)
        return
    provider = payment_provider(provider_for(op))
    step = _LINKED_STEP[op.kind]
    call = _claim(op.id, step, from_pending=True, purchase_id=op.purchase_id)
    if call is None:
        return
    parent_ref = parent.provider_reference if (parent := op.parent) else op.provider_reference
    key = op.provider_key(step)
    if op.kind == OperationKind.CAPTURE:
        fn = lambda: provider.capture_payment_intent(key=key, intent_id=parent_ref)  # noqa: E731
    elif op.kind == OperationKind.VOID:
        fn = lambda: provider.cancel_payment_intent(key=key, intent_id=parent_ref)  # noqa: E731
    else:
        fn = lambda: provider.create_refund(  # noqa: E731
            key=key,
            intent_id=parent_ref,
            amount=op.amount,
            metadata=_metadata(op),
        )
    result, answer = _send_for_apply(op.id, step, call, fn)
    _outcome_after_call(op, step, result, answer)


def operation_dispatch(*, operation_id: str) -> PaymentOperation:
    """Send one operation to the provider, at most once (one that is not pending is left as
    it is). No transaction may be open. Returns it as the dispatch left it, read for its
    view (payments.view_queries.operations_for_view)."""
    assert_outside_transaction()
    op = PaymentOperation.objects.select_related("purchase", "parent").get(id=operation_id)
    if op.outcome == Outcome.PENDING:
        try:
            if op.kind in PAYMENT_KINDS:
                _dispatch_payment(op)
            else:
                _dispatch_linked(op)
        except _HaltedAtClaim as halted:
            log.info("dispatch held: workflow %s is halted operation=%s", halted, op.id)
    dispatched = operation_for_view(operation_id)
    if dispatched is None:
        raise PaymentOperation.DoesNotExist(operation_id)
    return dispatched


def operation_dispatch_or_wait(*, operation_id: str) -> PaymentOperation:
    """For the outbox: dispatch, and raise if the operation is still queued (its workflow
    is halted) so the message backs off and runs again instead of being marked done."""
    op = operation_dispatch(operation_id=operation_id)
    if op.outcome == Outcome.PENDING:
        raise DomainError(
            ErrorCode.WORKFLOW_HALTED,
            f"The {operation_workflow(op.kind)} workflow is halted; the dispatch waits.",
            status=503,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            purchase=op.purchase_id,
            operation=op.id,
        )
    return op
