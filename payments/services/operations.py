"""Creating operations: payments, captures, voids, refunds (with their
approval and decline), each a row with its own idempotency key before anything is sent.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from recovery.halts import is_halted_with
from recovery.models import Order, StepRun, StepState

from ..customers import PAYMENT_METHOD_TOKEN
from ..enums import (
    NON_RETRYABLE_REASONS,
    PAYMENT_KINDS,
    SLOT_HOLDING_OUTCOMES,
    CallPurpose,
    CallStep,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    PurchaseStatus,
    Rail,
    Reason,
    RetryAdvice,
    Stage,
    Verification,
)
from ..errors import DomainError, ErrorCode
from ..locks import lock_client, lock_purchase, lock_purchase_or_none
from ..models import ApiClient, PaymentOperation, ProviderCall, Purchase
from ..money import format_money
from ..providers.base import payment_provider
from ..providers.registry import registered_rails
from .common import (
    REFUND_FAILURE_UNVERIFIED,
    _actor,
    _dispatch_backstop,
    _halted,
    _lock_or_404,
    _op_to,
    _purchase_to,
    change_batch,
    operation_audit_write,
    payment_captured,
    payment_refund_room,
    payment_refunds,
    provider_for,
    provider_for_rail,
    transition_record,
)
from .holds import _check_currency_allowed, _check_limit, _hold_reserve, _period_start
from .observations import outcome_apply_locked
from .purchases import purchase_bought_elsewhere
from .reconcile import operations_verify_before_follow_up

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def _fingerprint(params: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(params, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _active_op(purchase: Purchase) -> PaymentOperation | None:
    return purchase.operations.filter(outcome__in=SLOT_HOLDING_OUTCOMES).first()


def operation_insert_guarded(**fields: Any) -> PaymentOperation:
    """Create an operation row, refused (DomainError `payment_unresolved`) when the
    purchase's partial unique indexes refuse it (another operation holds the purchase's
    slot). Inserted under a savepoint: the indexes, not a check before the insert, are
    the real guard. A queued
    (pending) operation gets its dispatch backstop in the same transaction."""
    return _operation_insert(fields, savepoint=True)


def _operation_insert(fields: dict[str, Any], *, savepoint: bool) -> PaymentOperation:
    """`operation_insert_guarded`; `savepoint=False` for a caller whose whole transaction
    (or savepoint) rolls back on the refusal anyway: the insert needs none of its own."""
    try:
        with transaction.atomic(savepoint=savepoint):
            op = PaymentOperation.objects.create(**fields)
            if op.outcome == Outcome.PENDING:
                _dispatch_backstop(op)
            return op
    except IntegrityError as exc:
        purchase_id = fields["purchase"].id
        raise DomainError(
            ErrorCode.PAYMENT_UNRESOLVED,
            "Another payment operation on this purchase is in progress.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.RECONCILIATION,
            purchase=purchase_id,
        ) from exc


def _check_currency(purchase: Purchase, currency: str | None) -> None:
    """Strict money requests (docs/walkthrough.md#api-rules-the-code-relies-on): a currency
    other than the quote's is refused, never silently replaced by the quote's."""
    if currency is not None and currency.lower() != purchase.currency.lower():
        raise DomainError(
            ErrorCode.CURRENCY_MISMATCH,
            f"This purchase is priced in {purchase.currency}, not "
            f"{currency.lower()}; nothing was charged.",
            status=422,
            retry=RetryAdvice.FORBIDDEN,
            purchase=purchase.id,
            extra={"expected_currency": purchase.currency},
        )


def _payment_request_refusal(
    *, purchase_id: str, payment_method: str, capture_method: str, rail: str
) -> None:
    """The request itself, before anything is locked: a known capture method, a provider
    token for a payment method. Whether checkout is halted is read with the purchase's
    lock (`_payment_purchase_locked`)."""
    if capture_method not in ("automatic", "manual"):
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            "capture must be automatic or manual.",
            status=400,
            retry=RetryAdvice.NEW_OPERATION,
            purchase=purchase_id,
        )
    if not payment_method or len(payment_method) > 100:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            "payment_method is required (a provider token).",
            status=400,
            retry=RetryAdvice.NEW_OPERATION,
            purchase=purchase_id,
        )
    if provider_for_rail(rail).takes_payment_method_token and not PAYMENT_METHOD_TOKEN.fullmatch(
        payment_method
    ):
        # Verity never holds card data: anything but a provider token (a card number above
        # all) is refused here, before it is stored, logged or sent; the message never
        # repeats the value.
        raise DomainError(
            ErrorCode.INVALID_PAYMENT_METHOD,
            "payment_method must be a provider "
            "payment-method token (pm_… or tok_…), never card details.",
            status=400,
            retry=RetryAdvice.NEW_OPERATION,
            purchase=purchase_id,
        )


def _checkout_halted_refusal(purchase_id: str) -> NoReturn:
    raise DomainError(
        ErrorCode.WORKFLOW_HALTED,
        "Checkout is paused by an operator; send the same request again later.",
        status=503,
        retry=RetryAdvice.SAME_KEY,
        owner=Owner.SUPPORT,
        purchase=purchase_id,
    )


def _payment_purchase_locked(
    *,
    purchase_id: str,
    api_client: ApiClient | None,
    amount: int | None,
    currency: str | None,
    retry_of: str | None,
) -> tuple[Purchase, list[PaymentOperation]]:
    """The purchase, locked, and the request's money checked against it: the caller's own
    purchase, its currency, the quote's amount (a retry first asks whether the buyer paid
    for the same basket elsewhere meanwhile). With its payments and whatever holds its
    slot, for `_payment_refusal_locked`."""
    if retry_of:
        purchase_bought_elsewhere(purchase_id=purchase_id, api_client=api_client)
    purchase = lock_purchase_or_none(purchase_id, with_quote=True)
    # Read once the lock is held, in a statement after the lock's (with the purchase's
    # payments, `_payment_refusal_locked` reads them): a halt committed while this request
    # waited for the purchase binds it (read in the lock's statement, it would be seen as
    # it was when that statement began, and a one-call payment would be sent).
    ops: list[PaymentOperation] = []
    if purchase is not None:
        halted, ops = is_halted_with("checkout", _slot_operations(purchase_id))
        if halted:
            _checkout_halted_refusal(purchase_id)
    if purchase is None or (
        api_client is not None and purchase.api_client_id not in (None, api_client.id)
    ):
        raise DomainError(
            ErrorCode.NOT_FOUND, "No such purchase.", status=404, retry=RetryAdvice.FORBIDDEN
        )
    _check_currency(purchase, currency)
    _check_currency_allowed(api_client, purchase.currency)
    if amount is not None and amount != purchase.amount:
        raise DomainError(
            ErrorCode.AMOUNT_MISMATCH,
            "The amount comes from the accepted quote ("
            f"{format_money(purchase.amount, purchase.currency)}, "
            f"{purchase.amount} in minor units); a different amount is "
            "refused.",
            status=422,
            retry=RetryAdvice.FORBIDDEN,
            purchase=purchase.id,
        )
    return purchase, ops


def _slot_operations(purchase_id: str) -> QuerySet[PaymentOperation]:
    """A purchase's payments and whatever holds its slot."""
    return PaymentOperation.objects.filter(
        Q(kind__in=PAYMENT_KINDS) | Q(outcome__in=SLOT_HOLDING_OUTCOMES), purchase_id=purchase_id
    )


def _payment_refusal_locked(
    *,
    purchase: Purchase,
    ops: list[PaymentOperation],
    retry_of: str | None,
    payment_method: str,
) -> PaymentOperation | None:
    """Whether the locked purchase may be paid now: not paid, no money movement in flight,
    its quote alive, a failed payment retried only on purpose, once, with something
    changed, and attempts left. Returns the payment a retry names."""
    # `ops`: the purchase's payments and whatever holds its slot, read with the halt under
    # the purchase's lock (`_payment_purchase_locked`); no model ordering: by id, as
    # `.first()` took them.
    ops = sorted(ops, key=lambda o: o.id)
    payments = [o for o in ops if o.kind in PAYMENT_KINDS]
    paid = next(
        (o for o in payments if o.outcome == Outcome.SUCCEEDED and not o.is_duplicate), None
    )
    if retry_of and paid is not None and paid.id == retry_of:
        raise DomainError(
            ErrorCode.ORIGINAL_SUCCEEDED,
            "The payment this retry names did "
            "succeed at the provider (its earlier failure was a person's "
            "call, since overturned). Do not pay again.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.NONE,
            purchase=purchase.id,
            operation=paid.id,
        )
    if paid:
        raise DomainError(
            ErrorCode.ALREADY_PAID,
            "This purchase is already paid.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.NONE,
            purchase=purchase.id,
            operation=paid.id,
        )
    active = next((o for o in ops if o.outcome in SLOT_HOLDING_OUTCOMES), None)
    if active:
        raise DomainError(
            ErrorCode.PAYMENT_UNRESOLVED,
            "A payment on this purchase is not settled yet; the provider may have applied "
            "it. Do not retry: poll the operation.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.RECONCILIATION,
            purchase=purchase.id,
            operation=active.id,
        )
    if purchase.status in (PurchaseStatus.EXPIRED, PurchaseStatus.CANCELLED) or (
        purchase.quote.expires_at <= timezone.now()
    ):
        raise DomainError(
            ErrorCode.QUOTE_EXPIRED,
            "The quote behind this purchase expired; get a new quote.",
            status=409,
            retry=RetryAdvice.NEW_QUOTE,
            purchase=purchase.id,
        )
    last_failed = max(
        (o for o in payments if o.outcome == Outcome.FAILED),
        key=lambda o: o.created_at,
        default=None,
    )
    original = None
    if retry_of:
        original = next((o for o in ops if o.id == retry_of), None)
        if original is None or original.kind not in PAYMENT_KINDS:
            raise DomainError(
                ErrorCode.RETRY_OF_NOT_FOUND,
                "retry_of must name a payment operation of this purchase.",
                status=422,
                retry=RetryAdvice.FORBIDDEN,
                purchase=purchase.id,
            )
        if original.outcome != Outcome.FAILED:
            raise DomainError(
                ErrorCode.RETRY_NOT_ALLOWED,
                "Only a failed operation can be retried.",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                purchase=purchase.id,
                operation=original.id,
            )
        if original.grade == Grade.ACKNOWLEDGED:
            # Only a person's "failed", which the provider could not confirm yet (the
            # read-back above failed): the first may still charge. No second charge
            # until the provider is read.
            raise DomainError(
                ErrorCode.ORIGINAL_UNVERIFIED,
                "The payment this retry names was "
                "settled failed by a person, and the provider could not be "
                "read back yet: it may still charge. Try again later.",
                status=503,
                retry=RetryAdvice.SAME_KEY,
                owner=Owner.RECONCILIATION,
                purchase=purchase.id,
                operation=original.id,
            )
        if PaymentOperation.objects.filter(retry_of=original).exists():
            raise DomainError(
                ErrorCode.ALREADY_RETRIED,
                "This operation was already retried once.",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                purchase=purchase.id,
                operation=original.id,
            )
        if original.reason == Reason.CARD_DECLINED and original.payment_method == payment_method:
            raise DomainError(
                ErrorCode.RETRY_NEEDS_NEW_METHOD,
                "The card was declined; retry with a different payment_method.",
                status=422,
                retry=RetryAdvice.NEW_OPERATION,
                purchase=purchase.id,
                operation=original.id,
            )
        if original.reason in NON_RETRYABLE_REASONS and original.payment_method == payment_method:
            # Sent again unchanged it fails the same way (a retry chain that never
            # converges): something must change first.
            raise DomainError(
                ErrorCode.RETRY_NEEDS_NEW_METHOD,
                "The provider refused this payment "
                "as invalid; retry only with a different payment_method, "
                "or start from a new quote.",
                status=422,
                retry=RetryAdvice.NEW_QUOTE,
                purchase=purchase.id,
                operation=original.id,
            )
    elif last_failed is not None:
        raise DomainError(
            ErrorCode.RETRY_OF_REQUIRED,
            "The last payment failed; name it in retry_of to try again on purpose.",
            status=409,
            retry=RetryAdvice.NEW_OPERATION,
            purchase=purchase.id,
            operation=last_failed.id,
        )
    attempts = len(payments)
    if attempts >= settings.PAYMENT_ATTEMPTS_MAX:
        raise DomainError(
            ErrorCode.PAYMENT_ATTEMPTS_EXHAUSTED,
            f"This purchase already had {attempts} payment attempts; no "
            "more are made. Support will contact the buyer.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.SUPPORT,
            purchase=purchase.id,
            operation=original.id if original else None,
        )
    return original


def _payment_claim_locked(op: PaymentOperation, api_client: ApiClient | None) -> ProviderCall:
    """Claim a new one-call payment for its one send, in the transaction that creates it
    (docs/reliability.md#one-round-trip-where-the-provider-dedupes-keys): its step key's
    ProviderCall row and the time of the first send are persisted before anything leaves,
    and the hold is reserved under the client's lock (the limit's check; refused, nothing
    is created). The caller sends it right after commit
    (payments.services.dispatch.payment_send_claimed); a caller that dies first leaves it
    `dispatching` past its deadline, which the dead-dispatch sweep settles `unknown` and
    the reconciler asks again under the same key."""
    call = ProviderCall.objects.create(
        operation=op,
        purpose=CallPurpose.DISPATCH,
        step=CallStep.PAY,
        attempt=1,
        key=op.provider_key(CallStep.PAY),
    )
    transition_record(
        purchase_id=op.purchase_id,
        operation=op,
        field="outcome",
        source=Outcome.PENDING,
        target=op.outcome,
        cause=f"claim:{CallStep.PAY}",
        actor="dispatcher",
    )
    # Its backstop as a pending operation has (a second dispatch is a no-op).
    _dispatch_backstop(op)
    if not _hold_reserve(op):
        _check_limit(api_client, op.amount)  # raises, with the client's figures
        raise DomainError(
            ErrorCode.SPENDING_LIMIT_EXCEEDED,
            "This API client's spending limit does not cover this amount.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.SUPPORT,
        )
    return call


def _payment_insert_locked(
    *,
    purchase: Purchase,
    api_client: ApiClient | None,
    payment_method: str,
    capture_method: str,
    original: PaymentOperation | None,
    rail: str,
    claim_send: bool,
) -> tuple[PaymentOperation, ProviderCall | None]:
    """The operation (pending, or claimed for its one send with `claim_send`), its history
    and the purchase's move to payment_pending."""
    claimed = {}
    if claim_send:
        now = timezone.now()
        claimed = {
            "outcome": Outcome.DISPATCHING,
            "stage": Stage.DISPATCHING,
            "dispatch_deadline": now + timedelta(seconds=settings.DISPATCH_LEASE_SECONDS),
            "confirm_claimed_at": now,
        }
    else:
        _check_limit(api_client, purchase.amount)
    kind = OperationKind.AUTHORIZE if capture_method == "manual" else OperationKind.CHARGE
    fields: dict[str, Any] = dict(
        purchase=purchase,
        kind=kind,
        amount=purchase.amount,
        currency=purchase.currency,
        payment_method=payment_method,
        capture_method=capture_method,
        retry_of=original,
        rail=rail,
        requested_by_client=api_client,
        request_fingerprint=_fingerprint(
            {
                "purchase": purchase.id,
                "kind": kind,
                "amount": purchase.amount,
                "currency": purchase.currency,
                "payment_method": payment_method,
            }
        ),
        **claimed,
    )
    op = _operation_insert(fields, savepoint=False)
    transition_record(
        purchase_id=purchase.id,
        operation=op,
        field="outcome",
        source="",
        target=Outcome.PENDING,
        cause="operation_created",
        actor=api_client.name if api_client else "",
    )
    call = _payment_claim_locked(op, api_client) if claim_send else None
    _purchase_to(purchase, "mark_payment_pending", cause="payment_started")
    return op, call


def payment_create(
    *,
    purchase_id: str,
    api_client: ApiClient | None,
    payment_method: str,
    capture_method: str = "automatic",
    retry_of: str | None = None,
    amount: int | None = None,
    currency: str | None = None,
    rail: str = Rail.STRIPE,
) -> PaymentOperation:
    """A payment operation, `pending`: the caller dispatches it after commit (its backstop
    does if the caller dies first)."""
    _payment_request_refusal(
        purchase_id=purchase_id,
        payment_method=payment_method,
        capture_method=capture_method,
        rail=rail,
    )
    if retry_of and not transaction.get_connection().in_atomic_block:
        # Called outside a transaction: read the original back here (callers that bind an
        # idempotency key in their transaction call operations_verify_before_follow_up first),
        # unless checkout is halted: a halted checkout asks the provider nothing.
        if _halted("checkout"):
            _checkout_halted_refusal(purchase_id)
        operations_verify_before_follow_up(purchase_id=purchase_id)
    with transaction.atomic(), change_batch():
        purchase, ops = _payment_purchase_locked(
            purchase_id=purchase_id,
            api_client=api_client,
            amount=amount,
            currency=currency,
            retry_of=retry_of,
        )
        original = _payment_refusal_locked(
            purchase=purchase, ops=ops, retry_of=retry_of, payment_method=payment_method
        )
        op, _ = _payment_insert_locked(
            purchase=purchase,
            api_client=api_client,
            payment_method=payment_method,
            capture_method=capture_method,
            original=original,
            rail=rail,
            claim_send=False,
        )
    return op


def _pays_in_one_call(rail: str) -> bool:
    try:
        provider = payment_provider(provider_for_rail(rail))
    except TypeError:  # a rail that keeps its own evidence (x402) sends through its service
        return False
    return provider.pays_in_one_call()


def payment_create_claimed(
    *,
    purchase_id: str,
    api_client: ApiClient | None,
    payment_method: str,
    capture_method: str = "automatic",
    retry_of: str | None = None,
    amount: int | None = None,
    currency: str | None = None,
    rail: str = Rail.STRIPE,
) -> tuple[PaymentOperation, ProviderCall | None]:
    """`payment_create` in the caller's transaction (a keyed request's, which binds its key
    in it), for a caller that sends right after commit: where the rail pays in one call
    the operation is created already claimed for that send and its ProviderCall comes
    back (send it with payments.services.dispatch.payment_send_claimed); elsewhere it is
    `pending` (None: dispatch it as usual). No savepoint of its own: a refusal rolls back
    the caller's whole transaction, which binds nothing then. A retry's original is read
    back by the caller before its transaction (operations_verify_before_follow_up)."""
    assert transaction.get_connection().in_atomic_block, "call in the caller's transaction"
    _payment_request_refusal(
        purchase_id=purchase_id,
        payment_method=payment_method,
        capture_method=capture_method,
        rail=rail,
    )
    with change_batch():
        purchase, ops = _payment_purchase_locked(
            purchase_id=purchase_id,
            api_client=api_client,
            amount=amount,
            currency=currency,
            retry_of=retry_of,
        )
        original = _payment_refusal_locked(
            purchase=purchase, ops=ops, retry_of=retry_of, payment_method=payment_method
        )
        return _payment_insert_locked(
            purchase=purchase,
            api_client=api_client,
            payment_method=payment_method,
            capture_method=capture_method,
            original=original,
            rail=rail,
            claim_send=api_client is not None and _pays_in_one_call(rail),
        )


def _rails_final() -> list[str]:
    """The rails whose payment is final when it lands: nothing to capture or void."""
    return [rail for rail in registered_rails() if not provider_for_rail(rail).has_capture_and_void]


def _fulfilment_started(purchase_id: str) -> bool:
    return (
        Order.objects.filter(purchase_id=purchase_id).exists()
        or StepRun.objects.filter(purchase_id=purchase_id, state=StepState.DONE).exists()
    )


def _linked_create(
    *,
    purchase_id: str,
    kind: str,
    api_client: ApiClient | None,
    acting_user: User | None,
    halt: str,
    compensation: bool = False,
    after_fulfilment: bool = False,
) -> PaymentOperation:
    if _halted(halt):
        raise DomainError(
            ErrorCode.WORKFLOW_HALTED,
            f"The {halt} workflow is paused.",
            status=503,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            purchase=purchase_id,
        )
    if not transaction.get_connection().in_atomic_block:
        operations_verify_before_follow_up(purchase_id=purchase_id)
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        if api_client is not None and purchase.api_client_id not in (None, api_client.id):
            raise DomainError(ErrorCode.NOT_FOUND, "No such purchase.", status=404)
        final = purchase.operations.filter(
            kind__in=PAYMENT_KINDS, rail__in=_rails_final(), outcome=Outcome.SUCCEEDED
        ).first()
        if final is not None:
            # A rail whose payment is final when it lands (x402: a transfer on chain).
            raise DomainError(
                f"{final.rail}_has_no_void"
                if kind == OperationKind.VOID
                else f"{final.rail}_has_no_capture",
                f"This purchase was paid over "
                f"{final.rail}: {provider_for(final).no_capture_or_void_why}",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.NONE,
                purchase=purchase.id,
                operation=final.id,
            )
        auth = purchase.operations.filter(
            kind=OperationKind.AUTHORIZE, outcome=Outcome.SUCCEEDED, is_duplicate=False
        ).first()
        done = purchase.operations.filter(
            kind__in=[OperationKind.CAPTURE, OperationKind.VOID],
            outcome=Outcome.SUCCEEDED,
            parent__is_duplicate=False,
        ).first()
        if auth is None or done is not None:
            raise DomainError(
                ErrorCode.NOT_CAPTURABLE if kind == OperationKind.CAPTURE else "not_voidable",
                "There is no open authorization on this purchase.",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.NONE,
                purchase=purchase.id,
                operation=done.id if done else None,
            )
        if (
            kind == OperationKind.VOID
            and not compensation
            and not after_fulfilment
            and _fulfilment_started(purchase.id)
        ):
            # Goods may be out: a void now would leave them unpaid.
            raise DomainError(
                ErrorCode.FULFILMENT_STARTED,
                "Fulfilment of this purchase has started, so its "
                "authorization can no longer be voided here. Capture it instead, or ask "
                "support to void it in the console (with a reason): that also cancels the "
                "order.",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.SUPPORT,
                purchase=purchase.id,
                operation=auth.id,
            )
        active = _active_op(purchase)
        if active:
            raise DomainError(
                ErrorCode.PAYMENT_UNRESOLVED,
                "Another operation on this purchase is not settled yet.",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.RECONCILIATION,
                purchase=purchase.id,
                operation=active.id,
            )
        op = operation_insert_guarded(
            purchase=purchase,
            kind=kind,
            amount=auth.amount,
            currency=auth.currency,
            parent=auth,
            provider_reference=auth.provider_reference,
            requested_by_client=api_client,
            requested_by_user=acting_user,
            is_compensation=compensation,
        )
        transition_record(
            purchase_id=purchase.id,
            operation=op,
            field="outcome",
            source="",
            target=op.outcome,
            cause="operation_created",
            actor=_actor(api_client, acting_user),
        )
    return op


def capture_create(
    *, purchase_id: str, api_client: ApiClient | None = None, acting_user: User | None = None
) -> PaymentOperation:
    return _linked_create(
        purchase_id=purchase_id,
        kind=OperationKind.CAPTURE,
        api_client=api_client,
        acting_user=acting_user,
        halt="checkout",
    )


def void_create(
    *,
    purchase_id: str,
    api_client: ApiClient | None = None,
    acting_user: User | None = None,
    compensation: bool = False,
    after_fulfilment: bool = False,
) -> PaymentOperation:
    """`compensation` is set in the creating transaction (a crash cannot lose it).
    `after_fulfilment`: an operator's decision (console, audited) to void although
    fulfilment started; the API never passes it (409 `fulfilment_started`)."""
    return _linked_create(
        purchase_id=purchase_id,
        kind=OperationKind.VOID,
        api_client=api_client,
        acting_user=acting_user,
        halt="refunds",
        compensation=compensation,
        after_fulfilment=after_fulfilment,
    )


def refund_request(
    *,
    purchase_id: str,
    amount: int | None = None,
    api_client: ApiClient | None = None,
    acting_user: User | None = None,
    compensation: bool = False,
    currency: str | None = None,
) -> PaymentOperation:
    """A refund starts `awaiting_approval` unless it is a compensation or within the
    client's automatic-refund allowance (docs/console.md#refund-approval)."""
    if _halted("refunds"):
        raise DomainError(
            ErrorCode.WORKFLOW_HALTED,
            "Refunds are paused by an operator.",
            status=503,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            purchase=purchase_id,
        )
    if not transaction.get_connection().in_atomic_block:
        operations_verify_before_follow_up(purchase_id=purchase_id)
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        if api_client is not None and purchase.api_client_id not in (None, api_client.id):
            raise DomainError(ErrorCode.NOT_FOUND, "No such purchase.", status=404)
        _check_currency(purchase, currency)
        payment = purchase.operations.filter(
            kind__in=PAYMENT_KINDS, outcome=Outcome.SUCCEEDED, is_duplicate=False
        ).first()
        captured = payment_captured(payment) if payment is not None else 0
        if compensation and payment is not None:
            _supersede_pending_approvals(purchase, payment)
        # The room of the payment this refund will name (its parent), as approval, the
        # allowance, external refunds and the console ask it (one definition).
        refundable = payment_refund_room(payment) if payment is not None else 0
        amount = refundable if amount is None else amount
        if payment is None or captured <= 0:
            raise DomainError(
                ErrorCode.NOT_REFUNDABLE,
                "Nothing was captured on this purchase.",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.NONE,
                purchase=purchase.id,
            )
        rail = provider_for(payment)
        refusal = rail.refund_refusal()
        if refusal is not None:
            # The rail cannot send a refund here (x402: no refund signer is configured).
            raise DomainError(
                refusal.code,
                refusal.message,
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.SUPPORT,
                purchase=purchase.id,
                operation=payment.id,
            )
        if not isinstance(amount, int) or amount <= 0 or amount > refundable:
            raise DomainError(
                ErrorCode.REFUND_EXCEEDS_REFUNDABLE,
                f"Refundable now: {format_money(refundable, purchase.currency)} "
                f"({refundable} in minor units).",
                status=422,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.NONE,
                purchase=purchase.id,
                extra={"refundable": refundable},
            )
        # Where a refund is a transfer back of Verity's own money (x402) a person approves
        # it (no automatic allowance), unless it compensates Verity's own duplicate.
        auto = compensation or (
            not rail.refunds_need_a_person
            and api_client is not None
            and acting_user is None
            and _auto_refund_allowed(payment=payment, api_client=api_client, amount=amount)
        )
        op = operation_insert_guarded(
            purchase=purchase,
            kind=OperationKind.REFUND,
            amount=amount,
            currency=purchase.currency,
            parent=payment,
            rail=payment.rail,
            requested_by_client=api_client,
            requested_by_user=acting_user,
            is_compensation=compensation,
            outcome=Outcome.PENDING if auto else Outcome.AWAITING_APPROVAL,
        )
        transition_record(
            purchase_id=purchase.id,
            operation=op,
            field="outcome",
            source="",
            target=op.outcome,
            cause="refund_requested",
            evidence={"compensation": compensation},
            actor=_actor(api_client, acting_user),
        )
    return op


def _supersede_pending_approvals(
    purchase: Purchase,
    payment: PaymentOperation,
    *,
    reason: str = "superseded by the compensation of a failed fulfilment step",
    detail: str = "superseded_by_compensation",
) -> None:
    """A failed step's compensation returns everything the payment still holds: a refund
    of it still awaiting approval has sent nothing, so it is superseded — declined, with
    the reason recorded and audited — rather than subtracted.
    Subtracted, the compensation returned only the rest and, once finance declined the
    pending one, that part stayed with the merchant for a step the buyer never received.
    A lost dispute supersedes them too (payments.services.disputes): the bank returned
    the money, and approving one would pay the buyer back twice.
    Caller holds the purchase lock (approve and decline take it first too)."""
    for pending in (
        payment_refunds(payment)
        .filter(outcome=Outcome.AWAITING_APPROVAL)
        .select_for_update()
        .order_by("created_at")
    ):
        outcome_apply_locked(
            purchase,
            pending,
            Outcome.FAILED,
            grade=Grade.ACKNOWLEDGED,
            verification=Verification.MANUAL,
            cause="refund_superseded",
            actor="recovery",
            evidence={"reason": reason},
            reason=Reason.REFUND_DECLINED,
        )
        operation_audit_write(
            actor="recovery",
            action="refund_decline",
            op=pending,
            reason=reason,
            detail={"amount": pending.amount, detail: True},
        )


# Outcomes of an automatic refund that still count against the allowance: everything but
# "never approved" (awaiting approval, declined) and "failed" (nothing left the account)
# — a "failed" only a person gave counts until read back (REFUND_FAILURE_UNVERIFIED).
_AUTO_REFUND_COUNTED = (
    Outcome.PENDING,
    Outcome.DISPATCHING,
    Outcome.SUCCEEDED,
    Outcome.UNKNOWN,
    Outcome.AWAITING_PROVIDER,
    Outcome.AWAITING_BUYER,
)


def _auto_refunds(**filters: Any) -> int:
    """Sum of automatic refunds (no person requested or approved them, not compensations)."""
    return (
        PaymentOperation.objects.filter(
            Q(outcome__in=_AUTO_REFUND_COUNTED) | REFUND_FAILURE_UNVERIFIED,
            kind=OperationKind.REFUND,
            is_compensation=False,
            requested_by_user__isnull=True,
            approved_by_user__isnull=True,
            **filters,
        ).aggregate(s=Sum("amount"))["s"]
        or 0
    )


def _auto_refund_allowed(*, payment: PaymentOperation, api_client: ApiClient, amount: int) -> bool:
    """The automatic-refund allowance is cumulative: five refunds of 500 under
    a 500 allowance are 2 500 refunded without a person. Counted per payment under the
    purchase lock, and per client per period under the client's row lock (purchase ->
    client is the lock order), so two concurrent requests cannot both fit."""
    allowance = api_client.auto_refund_limit
    if amount <= 0 or allowance <= 0:
        return False
    if _auto_refunds(parent=payment) + amount > allowance:
        return False
    client = lock_client(api_client.id)
    start = _period_start(client) or timezone.now() - timedelta(days=1)
    period_cap: int = allowance * settings.AUTO_REFUND_PERIOD_MULTIPLE
    return _auto_refunds(requested_by_client=client, created_at__gte=start) + amount <= period_cap


def refund_approve(
    *, operation_id: str, acting_user: User, reason: str, audit: bool = True
) -> PaymentOperation:
    """`audit=False` is for a caller that writes the one (richer) audit row of this action
    in the same transaction (the console: IP, before/after)."""
    if not (reason or "").strip():
        raise DomainError(ErrorCode.REASON_REQUIRED, "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        if op.outcome != Outcome.AWAITING_APPROVAL:
            raise DomainError(
                ErrorCode.NOT_AWAITING_APPROVAL,
                "This refund is not awaiting approval.",
                status=409,
                operation=op.id,
                purchase=purchase.id,
            )
        if acting_user is None or op.requested_by_user_id == acting_user.id:
            raise DomainError(
                ErrorCode.APPROVER_IS_REQUESTER,
                "The person who requested a refund cannot approve it.",
                status=403,
                operation=op.id,
                purchase=purchase.id,
                owner=Owner.SUPPORT,
            )
        if _active_op(purchase):
            raise DomainError(
                ErrorCode.PAYMENT_UNRESOLVED,
                "Another operation on this purchase is not settled yet.",
                status=409,
                operation=op.id,
                purchase=purchase.id,
                owner=Owner.RECONCILIATION,
            )
        # Money may have moved since the request (a refund made outside Verity is booked
        # as an external operation): re-check refundable under the lock (no over-refund).
        # The room of the payment this refund names, without the refund itself (a
        # duplicate's compensation is the duplicate's, not a competitor).
        refundable = payment_refund_room(op.parent, exclude=op.pk) if op.parent else 0
        if op.amount > refundable:
            raise DomainError(
                ErrorCode.REFUND_EXCEEDS_REFUNDABLE,
                f"Refundable now: {max(refundable, 0)} {purchase.currency}.",
                status=422,
                operation=op.id,
                purchase=purchase.id,
                owner=Owner.SUPPORT,
                extra={"refundable": max(refundable, 0)},
            )
        op.approved_by_user = acting_user
        _op_to(
            op,
            "approve",
            cause="refund_approved",
            actor=acting_user.get_username(),
            evidence={"reason": reason},
            fields=("approved_by_user",),
        )
        _dispatch_backstop(op)
        if audit:
            operation_audit_write(
                actor=acting_user.get_username(), action="refund_approve", op=op, reason=reason
            )
    return op


def refund_decline(
    *,
    operation_id: str,
    reason: str,
    actor: str,
    acting_user: User | None = None,
    acting_client: ApiClient | None = None,
) -> PaymentOperation:
    """Finance declines a refund awaiting approval: it settles `failed` (`refund_declined`,
    graded acknowledged: a person's decision, nothing at the provider), which frees the
    refundable amount. Reason required; audited in the same transaction."""
    if not (reason or "").strip():
        raise DomainError(ErrorCode.REASON_REQUIRED, "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        if op.kind != OperationKind.REFUND or op.outcome != Outcome.AWAITING_APPROVAL:
            raise DomainError(
                ErrorCode.NOT_AWAITING_APPROVAL,
                "This refund is not awaiting approval.",
                status=409,
                operation=op.id,
                purchase=purchase.id,
                owner=Owner.NONE,
            )
        outcome_apply_locked(
            purchase,
            op,
            Outcome.FAILED,
            grade=Grade.ACKNOWLEDGED,
            verification=Verification.MANUAL,
            cause="refund_declined",
            actor=actor,
            evidence={"reason": reason},
            reason=Reason.REFUND_DECLINED,
        )
        operation_audit_write(
            actor=actor,
            action="refund_decline",
            op=op,
            reason=reason,
            detail={"amount": op.amount, "client": acting_client.name if acting_client else None},
        )
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)
