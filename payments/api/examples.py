"""The OpenAPI examples of the storefront API (drf-spectacular), kept out of the views so
a view reads as parse, call one service, render. Responses are shaped as the presenter
shapes them (payments/api/presenters.py); tests/api/test_contract.py checks the schema."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample

from . import presenters

# -- responses ------------------------------------------------------------------------

EXAMPLE_UNKNOWN = OpenApiExample(
    "Outcome unknown (202)",
    status_codes=["202"],
    response_only=True,
    value={
        "id": "op_6f1c2d",
        "purchase": "pur_9a8b7c",
        "purchase_status": "payment_unknown",
        "kind": "charge",
        "amount": 2500,
        "currency": "usd",
        "capture": "automatic",
        "outcome": "unknown",
        "stage": "reconciling",
        "grade": None,
        "verification": "unverified",
        "reason": None,
        "attempts": {"dispatch": 2, "reconcile": 0},
        "hold": {"amount": 2500, "currency": "usd", "state": "reserved"},
        "parent": None,
        "retry_of": None,
        "retried_by": None,
        "next_action": {
            "owner": "reconciliation",
            "retry": "forbidden",
            "code": "payment_unknown",
            "message": presenters.UNKNOWN_MESSAGE.format(
                operation_url="/api/v1/operations/op_6f1c2d"
            ),
        },
        "created_at": "2026-11-30T08:00:00Z",
        "settled_at": None,
    },
)
EXAMPLE_DECLINE = OpenApiExample(
    "Declined (402)",
    status_codes=["402"],
    response_only=True,
    value={
        "type": "urn:verity:problem:card_declined",
        "title": "Payment declined",
        "status": 402,
        "detail": "The payment was declined; no money moved.",
        "code": "card_declined",
        "purchase": "pur_9a8b7c",
        "operation": "op_6f1c2d",
        "next_action": {
            "owner": "buyer",
            "retry": "new_operation",
            "code": "card_declined",
            "message": "The card was declined; no money moved. To try again, "
            "ask the buyer for a different payment method and POST "
            "/api/v1/purchases/pur_9a8b7c/payments with "
            "retry_of=op_6f1c2d and a new Idempotency-Key.",
        },
    },
)
EXAMPLE_ALREADY_PAID = OpenApiExample(
    "Already paid (409)",
    status_codes=["409"],
    response_only=True,
    value={
        "type": "urn:verity:problem:already_paid",
        "title": "Conflict",
        "status": 409,
        "detail": "This purchase is already paid.",
        "code": "already_paid",
        "purchase": "pur_9a8b7c",
        "operation": "op_6f1c2d",
        "next_action": {
            "owner": "none",
            "retry": "forbidden",
            "code": "already_paid",
            "message": "This purchase is already paid; do not pay again.",
        },
    },
)
EXAMPLE_REUSED = OpenApiExample(
    "Key reused with another body (422)",
    status_codes=["422"],
    response_only=True,
    value={
        "type": "urn:verity:problem:idempotency_key_reused",
        "title": "Unprocessable request",
        "status": 422,
        "detail": "This Idempotency-Key was already used for a different request body.",
        "code": "idempotency_key_reused",
        "purchase": None,
        "operation": None,
        "next_action": {
            "owner": "buyer",
            "retry": "forbidden",
            "code": "idempotency_key_reused",
            "message": "If this is a new intent, use a new key; if it is a "
            "retry, send the original body unchanged.",
        },
    },
)
EXAMPLE_SUCCEEDED = OpenApiExample(
    "Succeeded (201)",
    status_codes=["201"],
    response_only=True,
    value={
        "id": "op_615aa03d",
        "purchase": "pur_5cc302c4",
        "purchase_status": "paid",
        "kind": "charge",
        "amount": 2500,
        "currency": "usd",
        "capture": "automatic",
        "outcome": "succeeded",
        "stage": "settled",
        "grade": "confirmed",
        "verification": "provider",
        "reason": None,
        "attempts": {"dispatch": 2, "reconcile": 0},
        "hold": {"amount": 2500, "currency": "usd", "state": "consumed"},
        "parent": None,
        "retry_of": None,
        "retried_by": None,
        "next_action": {
            "owner": "none",
            "retry": "forbidden",
            "code": "charge_succeeded",
            "message": "Done; the provider confirmed this operation. Do not send it again.",
        },
        "created_at": "2026-11-30T07:12:31Z",
        "settled_at": "2026-11-30T07:12:32Z",
    },
)
EXAMPLE_PURCHASE = OpenApiExample(
    "Purchase awaiting payment",
    response_only=True,
    status_codes=["200", "201"],
    value={
        "id": "pur_5cc302c4",
        "status": "awaiting_payment",
        "amount": 2500,
        "currency": "usd",
        "quote": {"id": "quo_3a0487dd", "version": 1},
        "customer": {"reference": "cust-42", "email": "ada@example.com"},
        "payment": None,
        "fulfillment": {
            "order": "pending",
            "inventory": "pending",
            "ledger": "pending",
            "confirmation": "pending",
            "crm": "pending",
        },
        "order_reference": None,
        "next_action": {
            "owner": "buyer",
            "retry": "new_operation",
            "code": "payment_required",
            "message": "Pay: POST /api/v1/purchases/pur_5cc302c4/payments "
            "with a new Idempotency-Key.",
        },
        "customer_message": "No payment has been made for this purchase yet.",
        "status_url": "http://127.0.0.1:8000/status/AviWGOJgaedQL0cZ/",
        "created_at": "2026-11-30T07:12:30Z",
    },
)
EXAMPLE_LIMITS = OpenApiExample(
    "Limits with an unknown payment",
    response_only=True,
    value={
        "currency": "usd",
        "limit": 100000,
        "period": "none",
        "period_start": None,
        "consumed": 2500,
        "reserved": 1800,
        "unknown_exposure": 1800,
        "available": 95700,
    },
)
EXAMPLE_PRODUCTS = OpenApiExample(
    "Catalogue",
    response_only=True,
    value={
        "products": [
            {
                "sku": "TEA-001",
                "name": "Sencha green tea, 100 g",
                "price": 1250,
                "currency": "usd",
                "stock": 50,
                "kind": "physical",
            }
        ]
    },
)

# -- requests -------------------------------------------------------------------------

EXAMPLE_QUOTE_REQUEST = OpenApiExample(
    "Two teas",
    request_only=True,
    value={"items": [{"sku": "TEA-001", "quantity": 2}], "currency": "usd"},
)
EXAMPLE_PURCHASE_REQUEST = OpenApiExample(
    "Purchase",
    request_only=True,
    value={
        "quote_id": "quo_1a2b3c",
        "quote_version": 1,
        "customer": {"reference": "cust-42", "email": "ada@example.com"},
    },
)
EXAMPLE_CHARGE_REQUEST = OpenApiExample(
    "Charge", request_only=True, value={"payment_method": "pm_card_visa", "capture": "automatic"}
)
EXAMPLE_RETRY_REQUEST = OpenApiExample(
    "Deliberate retry after a decline",
    request_only=True,
    value={"payment_method": "pm_card_mastercard", "capture": "automatic", "retry_of": "op_6f1c2d"},
)
EXAMPLE_REFUND_REQUEST = OpenApiExample("Partial refund", request_only=True, value={"amount": 500})
EXAMPLE_RESOLVE_REQUEST = OpenApiExample(
    "Resolve",
    request_only=True,
    value={"outcome": "failed", "reason": "Provider support confirmed no charge exists."},
)
