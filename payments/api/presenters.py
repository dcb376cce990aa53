"""The one presenter: the purchase, operation, quote and product views and their
`next_action`, built once from stored state. The REST API, the MCP tools (which only rename
actions to tool names), the console and the customer page all read these; a surface may
rename, never re-derive. Who acts next is derived in payments/next_action.py; the
`next_action` document here is its API rendering.

Read only. `next_action` is computed from state that is already stored, so every answer
(fresh, replayed, or a later GET) tells an agent the same thing about the same state.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection

from recovery.models import Order
from recovery.reads import STEP_STATES, steps_of

from ..customer_copy import customer_state
from ..enums import (
    PAYMENT_KINDS,
    CallPurpose,
    OperationKind,
    Outcome,
    Owner,
    Rail,
    RetryAdvice,
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
from ..next_action import (  # noqa: F401 (UNKNOWN_MESSAGE: re-exported)
    UNKNOWN_MESSAGE,
    api_action,
    latest_payment,
    operation_next_step,
    purchase_next_step,
    quote_usable,
)
from ..services.holds import _period_start
from ..services.holds import client_limits as figures_for
from ..view_queries import (
    PURCHASE_BY_ID,
    PURCHASE_OF_CLIENT,
    PURCHASE_WITH_LISTS_BY_ID,
    purchase_disputes,
    purchase_lists_rows,
    purchase_operations_forget,
    purchase_operations_loaded,
    purchase_order_reference,
    purchase_order_rows,
    purchase_view_calls,
    purchase_view_keep,
    read_together,
    retried_by_id,
)

_PAYMENT_KIND_VALUES = [k.value for k in PAYMENT_KINDS]


# -- next actions -----------------------------------------------------------------


def _action(owner: str, retry: str, code: str, message: str) -> dict:
    return {"owner": str(owner), "retry": str(retry), "code": code, "message": message}


def _quote_usable(quote: Quote) -> bool:
    return quote_usable(quote)


def operation_next_action(op: PaymentOperation) -> dict:
    """The derivation is payments.next_action's; this is its API rendering."""
    return api_action(operation_next_step(op))


def _latest_payment(purchase: Purchase) -> PaymentOperation | None:
    return latest_payment(purchase)


def purchase_next_action(purchase: Purchase, payment: PaymentOperation | None = None) -> dict:
    return api_action(purchase_next_step(purchase, payment))


# -- views --------------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


_iso = iso


def _customer_message(purchase: Purchase) -> str:
    return customer_state(purchase).message


def _order_reference(purchase_id: str) -> str | None:
    return Order.objects.filter(purchase_id=purchase_id).values_list("reference", flat=True).first()


def status_url(purchase: Purchase) -> str:
    return f"{settings.PUBLIC_BASE_URL.rstrip('/')}/status/{purchase.status_token}/"


def disputes_view(purchase: Purchase) -> list[dict]:
    return [
        {
            "id": d_id,
            "status": status,
            "amount": amount,
            "currency": currency,
            "reason": reason or None,
            "evidence_due_by": _iso(due_by),
        }
        for d_id, status, amount, currency, reason, due_by in purchase_disputes(purchase)
    ]


def _refund_summary(purchase: Purchase) -> dict:
    """How much was refunded (provider-settled), how much is in flight or awaiting approval,
    and why the latest failed refund failed: a partially refunded purchase says so."""
    refunded = in_flight = awaiting = 0
    last_failed = None
    loaded = purchase_operations_loaded(purchase)  # ordered by created_at, id
    # The return of a duplicate charge is not a refund of the purchase: the
    # duplicate and its compensation are the duplicate's, as the refundable room has it.
    refunds: Iterable[PaymentOperation]
    if loaded is not None:
        duplicates = {op.id for op in loaded if op.is_duplicate}
        refunds = [
            op
            for op in loaded
            if op.kind == OperationKind.REFUND and op.parent_id not in duplicates
        ]
    else:
        refunds = (
            purchase.operations.filter(kind=OperationKind.REFUND)
            .exclude(parent__is_duplicate=True)
            .order_by("created_at")
            .only("amount", "outcome", "reason")
        )
    for op in refunds:
        if op.outcome == Outcome.SUCCEEDED:
            refunded += op.amount
        elif op.outcome == Outcome.AWAITING_APPROVAL:
            awaiting += op.amount
        elif op.outcome == Outcome.FAILED:
            last_failed = op.reason or "failed"
        else:
            in_flight += op.amount
    return {
        "refunded": refunded,
        "in_flight": in_flight,
        "awaiting_approval": awaiting,
        "last_failed_reason": last_failed,
    }


def purchase_view(purchase: Purchase) -> dict:
    # Every read of the view in one round trip (payments.view_queries.read_together): the
    # operations (read once for the payment, the refunds and the customer copy), the order
    # reference, the disputes and the fulfilment steps.
    *rows, steps = read_together(*purchase_view_calls(purchase.id), (STEP_STATES, (purchase.id,)))
    return _purchase_view_with(purchase, rows, steps)


def purchase_view_for_client(*, purchase_id: str, api_client: ApiClient) -> dict | None:
    """`purchase_view` of the client's purchase (payments.selectors.purchase_get_for_client),
    or None when it is not the client's: the purchase read in the same round trip as the
    view's other reads (those are dropped unread when there is no purchase)."""
    found = _purchase_and_view(PURCHASE_OF_CLIENT, (purchase_id, api_client.pk), purchase_id)
    return found[1] if found is not None else None


def purchase_view_by_id(purchase_id: str) -> tuple[Purchase, dict]:
    """The purchase and its `purchase_view`, the purchase read in the same round trip as
    the view's other reads. Raises Purchase.DoesNotExist. On PostgreSQL the purchase's
    disputes and steps are read in its statement (the view every storefront event
    carries: two statements, not four)."""
    if connection.vendor != "postgresql":
        found = _purchase_and_view(PURCHASE_BY_ID, (purchase_id,), purchase_id)
        if found is None:
            raise Purchase.DoesNotExist(purchase_id)
        return found
    purchases, ops_rows = read_together(
        (PURCHASE_WITH_LISTS_BY_ID, (purchase_id,)),
        *purchase_view_calls(purchase_id, order_reference=False, disputes=False),
    )
    if not purchases:
        raise Purchase.DoesNotExist(purchase_id)
    purchase = PURCHASE_WITH_LISTS_BY_ID.instances_of(purchases)[0]
    dispute_rows, steps = purchase_lists_rows(purchase)
    rows = [ops_rows, purchase_order_rows(purchase), dispute_rows]
    return purchase, _purchase_view_with(purchase, rows, steps)


def _purchase_and_view(read, values: tuple, purchase_id: str) -> tuple[Purchase, dict] | None:
    """The purchase `read` finds (with its quote and order reference) and its view, in one
    round trip; None when there is none (the other reads are dropped unread)."""
    found, ops_rows, dispute_rows, steps = read_together(
        (read, values),
        *purchase_view_calls(purchase_id, order_reference=False),
        (STEP_STATES, (purchase_id,)),
    )
    if not found:
        return None
    purchase = read.instances_of(found)[0]
    rows = [ops_rows, purchase_order_rows(purchase), dispute_rows]
    return purchase, _purchase_view_with(purchase, rows, steps)


def _purchase_view_with(purchase: Purchase, rows: list, steps: list) -> dict:
    purchase_view_keep(purchase, *rows)
    try:
        return _purchase_view_of(
            purchase,
            order_reference=purchase_order_reference(purchase, _order_reference),
            fulfillment=steps_of(steps),
        )
    finally:
        purchase_operations_forget(purchase)


def _purchase_view_of(
    purchase: Purchase, *, order_reference: str | None, fulfillment: dict
) -> dict:
    payment = _latest_payment(purchase)
    return {
        "id": purchase.id,
        "status": purchase.status,
        "amount": purchase.amount,
        "currency": purchase.currency,
        "quote": {"id": purchase.quote_id, "version": purchase.quote.version},
        "customer": {"reference": purchase.customer_reference, "email": purchase.customer_email},
        "payment": _payment_summary(payment),
        "fulfillment": fulfillment,
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
        "hold": (
            {"amount": hold.amount, "currency": hold.currency, "state": hold.state}
            if hold
            else None
        ),
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
    summary = {"operation": payment.id, "outcome": payment.outcome, "grade": payment.grade or None}
    if payment.rail != Rail.STRIPE:
        # For x402 (docs/walkthrough.md#api-rules-the-code-relies-on) the purchase view carries
        # the rail, network and transaction.
        summary.update(rail=payment.rail, x402=x402_view(payment))
    return summary


def _unix_iso(seconds: int) -> str | None:
    """A chain timestamp as ISO 8601; None when no datetime can hold it (a buyer-chosen
    uint256 stored before validBefore was bounded: year >= 10000 must not break a view)."""
    try:
        return _iso(datetime.fromtimestamp(seconds, UTC))
    except (OverflowError, OSError, ValueError):
        return None


def x402_view(op: PaymentOperation) -> dict | None:
    """x402: network, payer, transaction hash and confirmations (the chain's last word)."""
    if op.rail != Rail.X402:
        return None
    back = X402RefundTransfer.objects.filter(pk=op.id).first()
    if back is not None:  # a refund: the transfer back to the payer
        return {
            "network": back.network,
            "payer": back.to_address,
            "transaction": back.transaction_hash or None,
            "confirmations": back.confirmations,
            "valid_before": None,
            "payment_identifier": None,
        }
    auth = X402Authorization.objects.filter(pk=op.id).first()
    if auth is None:
        return None
    return {
        "network": auth.network,
        "payer": auth.payer,
        "transaction": auth.transaction_hash or None,
        "confirmations": auth.confirmations,
        "valid_before": _unix_iso(auth.valid_before),
        "payment_identifier": auth.payment_identifier or None,
    }


def quote_view(quote: Quote) -> dict:
    return {
        "id": quote.id,
        "version": quote.version,
        "items": [
            {
                "sku": i.get("sku"),
                "name": i.get("name"),
                "quantity": i.get("quantity"),
                "unit_price": i.get("unit_price"),
            }
            for i in quote.items
        ],
        "amount": quote.amount,
        "currency": quote.currency,
        "expires_at": _iso(quote.expires_at),
        "next_action": (
            _action(
                Owner.BUYER,
                RetryAdvice.NEW_OPERATION,
                "purchase_required",
                "Create a purchase: POST /api/v1/purchases with this quote's id and "
                "version and a new Idempotency-Key.",
            )
            if _quote_usable(quote)
            else _action(
                Owner.BUYER,
                RetryAdvice.NEW_QUOTE,
                "quote_expired",
                "This quote is no longer valid: request a new quote.",
            )
        ),
    }


def product_view(product: Product) -> dict:
    return {
        "sku": product.sku,
        "name": product.name,
        "price": product.price,
        "currency": product.currency,
        "stock": product.stock,
        "kind": product.kind,
    }


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
