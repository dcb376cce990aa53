"""Checkout sessions: repricing from the catalogue, the status derived from the one
purchase, and the spec's `CheckoutSession` shape. Reads payments models; writes only
CheckoutSession rows (Purchase and PaymentOperation are written by payments.services)."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from payments import services
from payments.api.presenters import status_url
from payments.enums import PAYMENT_KINDS, Grade, Outcome, PurchaseStatus
from payments.errors import DomainError, ErrorCode
from payments.models import PaymentOperation, Product, Purchase
from payments.selectors import purchase_money

from .models import CheckoutSession
from .spec import API_VERSION

# Seconds an agent waits before asking again about a payment whose outcome is unknown
# (reconciliation's first read-back runs within this).
IN_PROGRESS_RETRY_AFTER = 5

HANDLER = {
    "id": "stripe_spt",
    "name": "dev.acp.tokenized.card",
    "display_name": "Card",
    "version": API_VERSION,
    "spec": "https://github.com/agentic-commerce-protocol/agentic-commerce-protocol",
    "requires_delegate_payment": True,
    "requires_pci_compliance": False,
    "psp": "stripe",
    "config_schema": "https://docs.stripe.com/agentic-commerce",
    "instrument_schemas": ["https://docs.stripe.com/api/shared-payment/granted-token"],
    "config": {"token_prefix": "spt_"},
}


# The purchase's status once paid -> the order status the platform sees: the same words in
# the session's `order` and in the order webhook (acp.handlers), so no face says
# "confirmed" about money that went back.
ORDER_STATUS: dict[str, str] = {
    PurchaseStatus.PAID: "confirmed",
    PurchaseStatus.FULFILLING: "processing",
    PurchaseStatus.COMPLETED: "completed",
    PurchaseStatus.REFUND_PENDING: "refund_pending",
    PurchaseStatus.REFUNDED: "refunded",
    PurchaseStatus.DISPUTED: "disputed",
    PurchaseStatus.DISPUTE_WON: "completed",
    PurchaseStatus.DISPUTE_LOST: "refunded",
    PurchaseStatus.VOIDED: "canceled",
}


def order_status(purchase_status: str, purchase_id: str) -> str:
    """The order status the platform sees for a purchase in `purchase_status`. A lost
    chargeback of part of the payment leaves the merchant the rest and the order standing
    (goods follow the money, read from its record: `purchase_money`), so it is not
    `refunded`: only money back in full is."""
    if purchase_status == PurchaseStatus.DISPUTE_LOST and not purchase_money(purchase_id).returned:
        return "completed"
    return ORDER_STATUS.get(purchase_status, purchase_status)


def failure_unconfirmed(op: PaymentOperation | None) -> bool:
    """A person's "failed" the provider has not confirmed (REST's `failure_unconfirmed`):
    money may have moved, so nothing may say "no money moved, pay again"."""
    return (
        op is not None
        and op.outcome == Outcome.FAILED
        and op.grade == Grade.ACKNOWLEDGED
        and not PaymentOperation.objects.filter(retry_of=op).exists()
    )


def attempts_exhausted(purchase_id: str) -> bool:
    """The purchase had as many payment attempts as Verity makes (services refuse more)."""
    return (
        PaymentOperation.objects.filter(purchase_id=purchase_id, kind__in=PAYMENT_KINDS).count()
        >= settings.PAYMENT_ATTEMPTS_MAX
    )


class Status:
    NOT_READY = "not_ready_for_payment"
    REQUIRES_ESCALATION = "requires_escalation"
    READY = "ready_for_payment"
    IN_PROGRESS = "complete_in_progress"
    COMPLETED = "completed"
    CANCELED = "canceled"
    EXPIRED = "expired"


def payment_op(purchase: Purchase | None) -> PaymentOperation | None:
    """The purchase's latest payment (a session's purchase has one, or a retry chain)."""
    if purchase is None:
        return None
    return (
        PaymentOperation.objects.filter(
            purchase=purchase, kind__in=PAYMENT_KINDS, is_duplicate=False
        )
        .order_by("-created_at")
        .first()
    )


def session_status(session: CheckoutSession, op: PaymentOperation | None = None) -> str:
    """Never more than the purchase knows: `completed` only once the provider's success is
    recorded, `complete_in_progress` while the payment is queued, sent or unknown."""
    purchase = session.purchase
    if purchase is not None:
        op = op or payment_op(purchase)
        if op is not None and op.outcome == Outcome.SUCCEEDED:
            return Status.COMPLETED
        if op is not None and (op.outcome != Outcome.FAILED or failure_unconfirmed(op)):
            # Queued, sent, unknown, or a person's unconfirmed "failed": not known yet.
            return Status.IN_PROGRESS
        if purchase.status == PurchaseStatus.CANCELLED:
            return Status.CANCELED
        if purchase.status == PurchaseStatus.EXPIRED or (
            purchase.quote.expires_at <= timezone.now()
        ):
            # A session is one purchase, priced by its quote: once that quote has run out
            # after a failed payment, nothing can pay this session (a new session can).
            return Status.EXPIRED
        if attempts_exhausted(purchase.id):
            return Status.REQUIRES_ESCALATION  # no more attempts; support contacts the buyer
        return Status.READY  # a declined payment: another token may be tried
    if session.canceled_at is not None:
        return Status.CANCELED
    if session.quote_id is None or item_problems(session):
        return Status.NOT_READY
    return Status.READY


def products_for(items: list[dict]) -> dict[str, Product]:
    return {p.sku: p for p in Product.objects.filter(sku__in=[str(i["id"]) for i in items])}


def item_problems(session: CheckoutSession, products: dict | None = None) -> list[dict]:
    """MessageError entries for items Verity cannot sell as asked."""
    products = products if products is not None else products_for(session.items)
    out = []
    for index, item in enumerate(session.items):
        product = products.get(str(item["id"]))
        param = f"$.line_items[{index}]"
        if product is None:
            out.append(_message(ErrorCode.NOT_FOUND, param, f"No product {item['id']!r}."))
        elif product.currency != session.currency:
            out.append(
                _message(
                    ErrorCode.INVALID,
                    param,
                    f"{product.sku} is sold in {product.currency}, not {session.currency}.",
                )
            )
        elif product.stock < item["quantity"]:
            out.append(
                _message(
                    ErrorCode.OUT_OF_STOCK,
                    param,
                    f"{product.sku}: {max(product.stock, 0)} in stock.",
                )
            )
        elif item["quantity"] > 1000:
            out.append(_message(ErrorCode.QUANTITY_EXCEEDED, param, "At most 1000 per item."))
    return out


def _message(code: str, param: str, content: str) -> dict:
    return {
        "type": "error",
        "code": code,
        "severity": "high",
        "resolution": "requires_buyer_input",
        "param": param,
        "content_type": "plain",
        "content": content,
    }


def reprice(session: CheckoutSession) -> None:
    """A new quote at current catalogue prices, or none while an item cannot be sold (the
    session then says which, in `messages`). Caller saves the session."""
    session.quote = None
    if session.items and not item_problems(session):
        try:
            session.quote = services.quote_create(
                api_client=session.api_client,
                currency=session.currency,
                items=[{"sku": str(i["id"]), "quantity": i["quantity"]} for i in session.items],
            )
        except DomainError:
            session.quote = None  # raced with stock or price: messages show the item


def normalise_items(items: list[dict]) -> list[dict]:
    return [{"id": str(i["id"]), "quantity": int(i.get("quantity", 1))} for i in items]


def _total(kind: str, text: str, amount: int) -> dict:
    return {"type": kind, "display_text": text, "amount": amount}


def fulfillment_options(products: dict[str, Product]) -> list[dict]:
    free = [_total("total", "Free", 0)]
    if products and all(p.kind == Product.Kind.DIGITAL for p in products.values()):
        return [{"type": "digital", "id": "digital", "title": "Digital delivery", "totals": free}]
    return [{"type": "shipping", "id": "standard", "title": "Standard shipping", "totals": free}]


def _iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def session_view(session: CheckoutSession) -> dict:
    purchase = session.purchase
    op = payment_op(purchase)
    status = session_status(session, op)
    products = products_for(session.items)
    quote = purchase.quote if purchase is not None else session.quote
    priced = {line["sku"]: line for line in (quote.items if quote else [])}
    line_items, base_total = [], 0
    for index, item in enumerate(session.items):
        sku, qty = str(item["id"]), item["quantity"]
        product = products.get(sku)
        unit = priced[sku]["unit_price"] if sku in priced else product.price if product else 0
        base_total += unit * qty
        # The item without `quantity` (the line carries it): the official Item schema has
        # none, so the answer validates with and without patch 1 (requests need it).
        line = {
            "id": f"li_{index + 1}",
            "item": {"id": sku, "unit_amount": unit},
            "quantity": qty,
            "unit_amount": unit,
            "totals": [
                _total("items_base_amount", "Items", unit * qty),
                _total("subtotal", "Subtotal", unit * qty),
                _total("total", "Total", unit * qty),
            ],
        }
        if product is not None:
            line["name"] = line["item"]["name"] = product.name
            line["availability_status"] = "in_stock" if product.stock >= qty else "out_of_stock"
        line_items.append(line)
    total = quote.amount if quote else base_total
    options = fulfillment_options(products)
    selected = session.selected_fulfillment_options or [
        {
            "type": options[0]["type"],
            "option_id": options[0]["id"],
            "item_ids": [str(i["id"]) for i in session.items],
        }
    ]
    messages = [] if purchase is not None else item_problems(session, products)
    if op is not None and op.outcome == Outcome.FAILED and status == Status.READY:
        messages.append(
            {
                **_message(
                    ErrorCode.PAYMENT_DECLINED,
                    "$.payment_data",
                    "The last payment did not go through; no money "
                    "moved. Complete again (a new Idempotency-Key).",
                ),
                "resolution": "requires_buyer_input",
            }
        )
    if op is not None and op.outcome == Outcome.FAILED and status == Status.EXPIRED:
        messages.append(
            {
                "type": "info",
                "severity": "info",
                "content_type": "plain",
                "content": "The last payment did not go through and no money "
                "moved; this session's price has expired since, so it "
                "cannot be paid. Open a new session for the buyer.",
            }
        )
    if status == Status.REQUIRES_ESCALATION:
        messages.append(
            {
                "type": "info",
                "severity": "info",
                "content_type": "plain",
                "content": "No payment went through and this session had as many "
                "payment attempts as Verity makes; no money moved. It "
                "cannot be paid any more: our support will contact "
                "the buyer.",
            }
        )
    if status == Status.IN_PROGRESS and failure_unconfirmed(op):
        messages.append(
            {
                "type": "info",
                "severity": "info",
                "content_type": "plain",
                "content": "Our team resolved this payment as failed, but the "
                "provider has not confirmed it, so the buyer may have "
                "been charged. Do not pay again: retrieve this session "
                "later; it says completed if the provider shows the "
                "charge, ready_for_payment if it confirms the failure.",
            }
        )
    elif status == Status.IN_PROGRESS:
        messages.append(
            {
                "type": "info",
                "severity": "info",
                "content_type": "plain",
                "content": "The payment's outcome is not known yet; the provider "
                "may have charged. Do not pay again: retrieve this "
                f"session after {IN_PROGRESS_RETRY_AFTER} seconds.",
            }
        )
    completed = purchase if status == Status.COMPLETED else None  # session_status: a purchase's
    said = order_status(completed.status, completed.id) if completed is not None else None
    if said in ("refunded", "refund_pending"):
        messages.append(
            {
                "type": "info",
                "severity": "info",
                "content_type": "plain",
                "content": "The payment was refunded to the buyer in full."
                if said == "refunded"
                else "A refund of this payment is in progress.",
            }
        )
    elif completed is not None and completed.status == PurchaseStatus.DISPUTE_LOST:
        messages.append(
            {
                "type": "info",
                "severity": "info",
                "content_type": "plain",
                "content": "The buyer's bank returned part of this payment; the rest "
                "stands and the order goes ahead.",
            }
        )
    view = {
        "id": session.id,
        "protocol": {"version": API_VERSION},
        "capabilities": {"payment": {"handlers": [HANDLER]}},
        "status": status,
        "currency": session.currency,
        "line_items": line_items,
        "fulfillment_options": options,
        "selected_fulfillment_options": selected,
        "totals": [
            _total("items_base_amount", "Items", base_total),
            _total("subtotal", "Subtotal", total),
            _total("fulfillment", "Shipping", 0),
            _total("total", "Total", total),
        ],
        "messages": messages,
        "links": (
            [{"type": "support", "url": status_url(purchase)}] if purchase is not None else []
        ),
        "created_at": _iso(session.created_at),
        "updated_at": _iso(session.updated_at),
    }
    if quote is not None and purchase is None:
        view["expires_at"] = _iso(quote.expires_at)
    if session.buyer:
        view["buyer"] = session.buyer
    if session.fulfillment_details:
        view["fulfillment_details"] = session.fulfillment_details
    if completed is not None:
        view["order"] = {
            "type": "order",
            "id": completed.id,
            "checkout_session_id": session.id,
            "permalink_url": status_url(completed),
            "status": order_status(completed.status, completed.id),
        }
    return view


def session_for_client(session_id: str, api_client) -> CheckoutSession | None:
    return (
        CheckoutSession.objects.select_related("purchase__quote", "quote")
        .filter(pk=session_id, api_client=api_client)
        .first()
    )


__all__ = [
    "HANDLER",
    "IN_PROGRESS_RETRY_AFTER",
    "ORDER_STATUS",
    "Status",
    "attempts_exhausted",
    "failure_unconfirmed",
    "order_status",
    "item_problems",
    "normalise_items",
    "payment_op",
    "reprice",
    "session_for_client",
    "session_status",
    "session_view",
]
