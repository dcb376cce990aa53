"""The one presenter: the purchase, operation, quote and product views and their
`next_action`, built once from stored state. The REST API, the MCP tools (which only rename
actions to tool names), the console and the customer page all read these; a surface may
rename, never re-derive.

Read only. `next_action` is computed from state that is already stored, so every answer
(fresh, replayed, or a later GET) tells an agent the same thing about the same state.
"""
from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.utils import timezone

from recovery.models import Order
from recovery.selectors import steps_for_purchase

from ..customer_copy import customer_state
from ..enums import (
    NON_RETRYABLE_REASONS,
    PAYMENT_KINDS,
    CallPurpose,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    PurchaseStatus,
    Reason,
    RetryAdvice,
    Stage,
)
from ..models import (
    ApiClient,
    Hold,
    PaymentOperation,
    Product,
    Purchase,
    Quote,
    X402Authorization,
    X402RefundTransfer,
)
from ..services.holds import _period_start, client_limits as figures_for
from ..view_queries import (
    purchase_operations_forget,
    purchase_operations_load,
    purchase_operations_loaded,
    purchase_order_reference,
    retried_by_id,
)

_PAYMENT_KIND_VALUES = [k.value for k in PAYMENT_KINDS]

UNKNOWN_MESSAGE = (
    "The payment provider may have applied this payment. Verity is reconciling it with the "
    "provider now. Do not retry and do not create a new payment or a new purchase: that "
    "could charge the customer twice. Poll GET {operation_url} until `outcome` is "
    "`succeeded` or `failed`."
)


# -- next actions -----------------------------------------------------------------


def _action(owner: str, retry: str, code: str, message: str) -> dict:
    return {"owner": str(owner), "retry": str(retry), "code": code, "message": message}


def _api_path(path: str) -> str:
    return f"/api/v1/{path}"


def _quote_usable(quote: Quote) -> bool:
    return quote.superseded_at is None and quote.expires_at > timezone.now()


def operation_next_action(op: PaymentOperation) -> dict:
    op_url = _api_path(f"operations/{op.id}")
    if not op.is_terminal and (op.stage == Stage.ESCALATED or op.escalated_at is not None):
        return _action(Owner.SUPPORT, RetryAdvice.FORBIDDEN, "escalated",
                       "Reconciliation did not settle this operation in time; support owns "
                       f"it now. Do not retry. Poll GET {op_url}.")
    outcome = op.outcome
    if outcome in (Outcome.PENDING, Outcome.DISPATCHING):
        return _action(Owner.RECONCILIATION, RetryAdvice.FORBIDDEN, f"operation_{outcome}",
                       "The operation is being sent to the provider. Do not retry; "
                       f"poll GET {op_url}.")
    if outcome == Outcome.UNKNOWN:
        return _action(Owner.RECONCILIATION, RetryAdvice.FORBIDDEN, "payment_unknown",
                       UNKNOWN_MESSAGE.format(operation_url=op_url))
    if outcome == Outcome.AWAITING_PROVIDER:
        return _action(Owner.RECONCILIATION, RetryAdvice.FORBIDDEN, "awaiting_provider",
                       "The provider is still processing this operation. Do not retry; "
                       f"poll GET {op_url}.")
    if outcome == Outcome.AWAITING_BUYER:
        return _action(Owner.BUYER, RetryAdvice.FORBIDDEN, "action_required",
                       "The buyer must complete an authentication step with the provider. "
                       f"Do not create another payment; poll GET {op_url}.")
    if outcome == Outcome.AWAITING_APPROVAL:
        return _action(Owner.SUPPORT, RetryAdvice.FORBIDDEN, "awaiting_approval",
                       "This refund waits for approval by a finance user. Do not request it "
                       f"again; poll GET {op_url}.")
    by_team = op.grade == Grade.ACKNOWLEDGED  # words follow the grade (DESIGN §4)
    if outcome == Outcome.SUCCEEDED:
        if by_team:
            return _action(Owner.NONE, RetryAdvice.FORBIDDEN, f"{op.kind}_succeeded",
                           "Done; confirmed by our team (the provider has not confirmed it "
                           "yet, and its record would overrule). Do not send it again.")
        return _action(Owner.NONE, RetryAdvice.FORBIDDEN, f"{op.kind}_succeeded",
                       "Done; the provider confirmed this operation. Do not send it again.")
    # failed
    reason = op.reason or Reason.PROVIDER_FAILED
    failed = ("Our team resolved this payment as failed (the provider has not confirmed it); "
              "Verity reads the provider back before any retry." if by_team else
              "This payment failed; no money moved.")
    # "no money moved" is the provider's word only: a person's "failed" may be overturned.
    failed_nothing_moved = (failed if by_team else "This payment failed and no money moved.")
    if op.kind in _PAYMENT_KIND_VALUES:
        purchase = op.purchase
        retry_id = retried_by_id(op)
        if retry_id is not None:
            return _action(Owner.NONE, RetryAdvice.FORBIDDEN, reason,
                           f"This payment failed and was already retried as "
                           f"{retry_id}; follow that operation instead.")
        if not _quote_usable(purchase.quote):
            return _action(Owner.BUYER, RetryAdvice.NEW_QUOTE, reason,
                           f"{failed_nothing_moved} The quote is no longer "
                           "valid: request a new quote and create a new purchase.")
        attempts = getattr(op, "view_payment_attempts", None)  # payments.view_queries
        if attempts is None:
            attempts = purchase.operations.filter(kind__in=_PAYMENT_KIND_VALUES).count()
        if attempts >= settings.PAYMENT_ATTEMPTS_MAX:
            # Retries converge: a bounded number of attempts, then a person.
            return _action(Owner.SUPPORT, RetryAdvice.FORBIDDEN, "payment_attempts_exhausted",
                           f"{failed_nothing_moved} This purchase had "
                           f"{attempts} payment attempts, the most allowed; support will "
                           "contact the buyer. Do not retry.")
        if reason in NON_RETRYABLE_REASONS:
            return _action(Owner.BUYER, RetryAdvice.NEW_QUOTE, reason,
                           "The provider refused this payment as invalid; no money moved. Sent "
                           "again unchanged it would fail the same way: ask the buyer for a "
                           "different payment method, or request a new quote and create a "
                           "new purchase.")
        if reason == Reason.CARD_DECLINED:
            message = ("The card was declined; no money moved. To try again, ask the buyer "
                       f"for a different payment method and POST "
                       f"{_api_path(f'purchases/{purchase.id}/payments')} with "
                       f"retry_of={op.id} and a new Idempotency-Key.")
        else:
            message = (f"{failed} You may try once more: POST "
                       f"{_api_path(f'purchases/{purchase.id}/payments')} with "
                       f"retry_of={op.id} and a new Idempotency-Key.")
        return _action(Owner.BUYER, RetryAdvice.NEW_OPERATION, reason, message)
    return _action(Owner.SUPPORT, RetryAdvice.FORBIDDEN, reason,
                   f"This {op.kind} failed at the provider; support has been told. "
                   "Do not retry it yourself.")


def _latest_payment(purchase: Purchase) -> PaymentOperation | None:
    loaded = purchase_operations_loaded(purchase)
    if loaded is not None:  # inside purchase_view: the same answer from the one read
        payments = [op for op in loaded if op.kind in _PAYMENT_KIND_VALUES]
        succeeded = [op for op in payments if op.outcome == Outcome.SUCCEEDED]
        if succeeded:
            return min(succeeded, key=lambda op: op.pk)
        return max(payments, key=lambda op: (op.created_at, op.pk)) if payments else None
    ops = purchase.operations.filter(kind__in=_PAYMENT_KIND_VALUES)
    return (ops.filter(outcome=Outcome.SUCCEEDED).first()
            or ops.order_by("-created_at", "-id").first())


def purchase_next_action(purchase: Purchase, payment: PaymentOperation | None = None) -> dict:
    status = purchase.status
    pay_url = _api_path(f"purchases/{purchase.id}/payments")
    view_url = _api_path(f"purchases/{purchase.id}")
    if payment is None:
        payment = _latest_payment(purchase)
    if status == PurchaseStatus.AWAITING_PAYMENT:
        if not _quote_usable(purchase.quote):
            return _action(Owner.BUYER, RetryAdvice.NEW_QUOTE, "quote_expired",
                           "The quote is no longer valid: request a new quote.")
        return _action(Owner.BUYER, RetryAdvice.NEW_OPERATION, "payment_required",
                       f"Pay: POST {pay_url} with a new Idempotency-Key.")
    if status in (PurchaseStatus.PAYMENT_PENDING, PurchaseStatus.PAYMENT_UNKNOWN,
                  PurchaseStatus.ACTION_REQUIRED, PurchaseStatus.PAYMENT_FAILED) and payment:
        return operation_next_action(payment)
    if status == PurchaseStatus.PAYMENT_UNKNOWN:
        return _action(Owner.RECONCILIATION, RetryAdvice.FORBIDDEN, "payment_unknown",
                       UNKNOWN_MESSAGE.format(operation_url=view_url))
    if status in (PurchaseStatus.PAID, PurchaseStatus.FULFILLING):
        return _action(Owner.NONE, RetryAdvice.FORBIDDEN, "paid",
                       "Paid. Fulfilment is in progress; do not pay again. "
                       f"Poll GET {view_url} for the order.")
    if status == PurchaseStatus.COMPLETED:
        return _action(Owner.NONE, RetryAdvice.FORBIDDEN, "completed",
                       "Paid and fulfilled. Nothing to do.")
    if status == PurchaseStatus.MANUAL_REVIEW:
        return _action(Owner.SUPPORT, RetryAdvice.FORBIDDEN, "manual_review",
                       "Support is reviewing this purchase. Do not pay again and do not open "
                       f"a new purchase for it; poll GET {view_url}.")
    if status == PurchaseStatus.REFUND_PENDING:
        return _action(Owner.RECONCILIATION, RetryAdvice.FORBIDDEN, "refund_pending",
                       f"A refund is in progress. Do not request it again; poll GET {view_url}.")
    if status == PurchaseStatus.DISPUTED:
        return _action(Owner.SUPPORT, RetryAdvice.FORBIDDEN, "disputed",
                       "The customer disputed this payment with their bank; finance is "
                       "handling it. Do not pay again, do not refund it yourself and do not "
                       f"open a new purchase for it; poll GET {view_url}.")
    if status == PurchaseStatus.DISPUTE_WON:
        return _action(Owner.NONE, RetryAdvice.FORBIDDEN, "dispute_won",
                       "A dispute on this payment was decided in the merchant's favour; the "
                       "payment stands. Nothing to do.")
    if status == PurchaseStatus.DISPUTE_LOST:
        return _action(Owner.NONE, RetryAdvice.FORBIDDEN, "dispute_lost",
                       "A dispute on this payment was decided in the customer's favour; the "
                       "bank returned the money to them. This purchase is closed; do not "
                       "pay again.")
    if status in (PurchaseStatus.REFUNDED, PurchaseStatus.VOIDED, PurchaseStatus.CANCELLED):
        return _action(Owner.NONE, RetryAdvice.FORBIDDEN, str(status),
                       "This purchase is closed. Nothing to do.")
    if status == PurchaseStatus.EXPIRED:
        return _action(Owner.BUYER, RetryAdvice.NEW_QUOTE, "expired",
                       "This purchase expired before payment: request a new quote.")
    return _action(Owner.BUYER, RetryAdvice.NEW_OPERATION, "payment_required",
                   f"Pay: POST {pay_url} with a new Idempotency-Key.")


# -- views --------------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


_iso = iso


def _customer_message(purchase: Purchase) -> str:
    return customer_state(purchase).message


def _fulfillment(purchase_id: str) -> dict:
    return dict(steps_for_purchase(purchase_id))


def _order_reference(purchase_id: str) -> str | None:
    return Order.objects.filter(purchase_id=purchase_id).values_list(
        "reference", flat=True).first()


def status_url(purchase: Purchase) -> str:
    return f"{settings.PUBLIC_BASE_URL.rstrip('/')}/status/{purchase.status_token}/"


def disputes_view(purchase: Purchase) -> list[dict]:
    return [{"id": d.id, "status": d.status, "amount": d.amount, "currency": d.currency,
             "reason": d.reason or None, "evidence_due_by": _iso(d.evidence_due_by)}
            for d in purchase.disputes.order_by("opened_at", "id")]
def _refund_summary(purchase: Purchase) -> dict:
    """How much was refunded (provider-settled), how much is in flight or awaiting approval,
    and why the latest failed refund failed: a partially refunded purchase says so."""
    refunded = in_flight = awaiting = 0
    last_failed = None
    loaded = purchase_operations_loaded(purchase)  # ordered by created_at, id
    # The return of a duplicate charge is not a refund of the purchase (issue 30 #9): the
    # duplicate and its compensation are the duplicate's, as the refundable room has it.
    if loaded is not None:
        duplicates = {op.id for op in loaded if op.is_duplicate}
        refunds = [op for op in loaded if op.kind == OperationKind.REFUND
                   and op.parent_id not in duplicates]
    else:
        refunds = (purchase.operations.filter(kind=OperationKind.REFUND)
                   .exclude(parent__is_duplicate=True)
                   .order_by("created_at").only("amount", "outcome", "reason"))
    for op in refunds:
        if op.outcome == Outcome.SUCCEEDED:
            refunded += op.amount
        elif op.outcome == Outcome.AWAITING_APPROVAL:
            awaiting += op.amount
        elif op.outcome == Outcome.FAILED:
            last_failed = op.reason or "failed"
        else:
            in_flight += op.amount
    return {"refunded": refunded, "in_flight": in_flight, "awaiting_approval": awaiting,
            "last_failed_reason": last_failed}


def purchase_view(purchase: Purchase) -> dict:
    # The operations are read once for the payment, the refunds and the customer copy.
    purchase_operations_load(purchase)
    try:
        return _purchase_view_of(purchase, order_reference=purchase_order_reference(
            purchase, _order_reference))
    finally:
        purchase_operations_forget(purchase)


def _purchase_view_of(purchase: Purchase, *, order_reference: str | None) -> dict:
    payment = _latest_payment(purchase)
    return {
        "id": purchase.id,
        "status": purchase.status,
        "amount": purchase.amount,
        "currency": purchase.currency,
        "quote": {"id": purchase.quote_id, "version": purchase.quote.version},
        "customer": {"reference": purchase.customer_reference,
                     "email": purchase.customer_email},
        "payment": _payment_summary(payment),
        "fulfillment": _fulfillment(purchase.id),
        "refunds": _refund_summary(purchase),
        "order_reference": order_reference,
        "disputes": disputes_view(purchase),
        "next_action": purchase_next_action(purchase, payment),
        "customer_message": _customer_message(purchase),
        "status_url": status_url(purchase),
        "created_at": _iso(purchase.created_at),
    }


def operation_view(op: PaymentOperation) -> dict:
    try:  # joined by payments.view_queries.operations_for_view, else one query
        hold = op.hold
    except Hold.DoesNotExist:
        hold = None
    dispatch = getattr(op, "view_dispatch_attempts", None)
    reconcile = getattr(op, "view_reconcile_attempts", None)
    if dispatch is None or reconcile is None:
        calls = list(op.provider_calls.all())
        dispatch = sum(1 for c in calls if c.purpose == CallPurpose.DISPATCH)
        reconcile = sum(1 for c in calls if c.purpose == CallPurpose.RECONCILE)
    retried_by = retried_by_id(op) if op.kind in _PAYMENT_KIND_VALUES else None
    return {
        "id": op.id,
        "purchase": op.purchase_id,
        "purchase_status": op.purchase.status,
        "kind": op.kind,
        "amount": op.amount,
        "currency": op.currency,
        "capture": op.capture_method,
        "outcome": op.outcome,
        "stage": op.stage,
        "grade": op.grade or None,
        "verification": op.verification,
        "reason": op.reason or None,
        "attempts": {
            "dispatch": dispatch,
            "reconcile": reconcile,
        },
        "hold": ({"amount": hold.amount, "currency": hold.currency, "state": hold.state}
                 if hold else None),
        "parent": op.parent_id,
        "origin": op.origin,
        "retry_of": op.retry_of_id,
        "retried_by": retried_by,
        "next_action": operation_next_action(op),
        "created_at": _iso(op.created_at),
        "settled_at": _iso(op.settled_at),
        "rail": op.rail,
        "x402": x402_view(op),
    }


def _payment_summary(payment: PaymentOperation | None) -> dict | None:
    if payment is None:
        return None
    summary = {"operation": payment.id, "outcome": payment.outcome,
               "grade": payment.grade or None}
    if payment.rail != "stripe":
        # DESIGN §6: for x402 the purchase view carries the rail, network and transaction.
        summary.update(rail=payment.rail, x402=x402_view(payment))
    return summary


def _unix_iso(seconds: int) -> str | None:
    """A chain timestamp as ISO 8601; None when no datetime can hold it (a buyer-chosen
    uint256 stored before issue 31 bounded it: year >= 10000 must not break a view)."""
    try:
        return _iso(datetime.fromtimestamp(seconds, dt_timezone.utc))
    except (OverflowError, OSError, ValueError):
        return None


def x402_view(op: PaymentOperation) -> dict | None:
    """x402: network, payer, transaction hash and confirmations (the chain's last word)."""
    if op.rail != "x402":
        return None
    back = X402RefundTransfer.objects.filter(pk=op.id).first()
    if back is not None:  # a refund: the transfer back to the payer
        return {"network": back.network, "payer": back.to_address,
                "transaction": back.transaction_hash or None,
                "confirmations": back.confirmations, "valid_before": None,
                "payment_identifier": None}
    auth = X402Authorization.objects.filter(pk=op.id).first()
    if auth is None:
        return None
    return {"network": auth.network, "payer": auth.payer,
            "transaction": auth.transaction_hash or None, "confirmations": auth.confirmations,
            "valid_before": _unix_iso(auth.valid_before),
            "payment_identifier": auth.payment_identifier or None}


def quote_view(quote: Quote) -> dict:
    return {
        "id": quote.id,
        "version": quote.version,
        "items": [{"sku": i.get("sku"), "name": i.get("name"), "quantity": i.get("quantity"),
                   "unit_price": i.get("unit_price")} for i in quote.items],
        "amount": quote.amount,
        "currency": quote.currency,
        "expires_at": _iso(quote.expires_at),
        "next_action": (
            _action(Owner.BUYER, RetryAdvice.NEW_OPERATION, "purchase_required",
                    "Create a purchase: POST /api/v1/purchases with this quote's id and "
                    "version and a new Idempotency-Key.")
            if _quote_usable(quote) else
            _action(Owner.BUYER, RetryAdvice.NEW_QUOTE, "quote_expired",
                    "This quote is no longer valid: request a new quote.")),
    }


def product_view(product: Product) -> dict:
    return {"sku": product.sku, "name": product.name, "price": product.price,
            "currency": product.currency, "stock": product.stock, "kind": product.kind}


# -- limits -----------------------------------------------------------------------------


def client_limits_view(api_client: ApiClient) -> dict:
    """limit, consumed, reserved, unknown_exposure (minor units, the client's currency).

    The figures are the very ones the core's limit check uses (services.client_limits), so
    what a client reads is what it will be held to.
    """
    figures = figures_for(api_client)
    limit = figures["limit"] or None
    return {
        "currency": figures["currency"],
        "limit": limit,
        "period": figures["period"],
        "period_start": _iso(_period_start(api_client)),
        "consumed": figures["consumed"],
        "reserved": figures["reserved"],
        "unknown_exposure": figures["unknown_exposure"],
        "available": figures["available"] if limit else None,
    }
