"""Provider events as Stripe sends them: built (event_for, intent_object, refund_object),
signed ourselves (HMAC-SHA256 over "<t>.<body>", exactly what Stripe and localstripe do)
and posted to the real endpoint."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time

SECRET = "whsec_test_current"


OLD_SECRET = "whsec_test_previous"


def sign(body: bytes, secret: str = SECRET, ts: int | None = None) -> str:
    ts = int(time.time()) if ts is None else ts
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def event_for(
    obj: dict, type_: str, *, event_id: str | None = None, account: str | None = None
) -> dict:
    event = {
        "id": event_id or f"evt_{secrets.token_hex(8)}",
        "object": "event",
        "api_version": "2024-06-20",
        "created": int(time.time()),
        "livemode": False,
        "type": type_,
        "data": {"object": obj},
    }
    if account is not None:
        event["account"] = account
    return event


def intent_object(
    *,
    pi_id: str,
    status: str,
    amount: int,
    currency: str = "usd",
    metadata: dict | None = None,
    error_code: str | None = None,
) -> dict:
    """A PaymentIntent as Stripe sends it, including the card details we must not keep."""
    return {
        "id": pi_id,
        "object": "payment_intent",
        "status": status,
        "amount": amount,
        "currency": currency,
        "capture_method": "automatic",
        "client_secret": f"{pi_id}_secret_xyz",
        "metadata": {**(metadata or {}), "note": "free text"},
        "latest_charge": {
            "id": "ch_embedded",
            "object": "charge",
            "billing_details": {"name": "Jane Buyer", "email": "jane@example.com"},
            "payment_method_details": {
                "card": {"last4": "4242", "exp_month": 12, "exp_year": 2030, "fingerprint": "fpX"}
            },
        },
        "last_payment_error": (
            {
                "code": error_code,
                "message": "Your card was declined.",
                "payment_method": {"card": {"last4": "0341"}},
            }
            if error_code
            else None
        ),
        "payment_method": "pm_card_visa",
    }


def refund_object(
    *,
    re_id: str,
    status: str,
    amount: int,
    pi_id: str,
    currency: str = "usd",
    metadata: dict | None = None,
) -> dict:
    return {
        "id": re_id,
        "object": "refund",
        "status": status,
        "amount": amount,
        "currency": currency,
        "payment_intent": pi_id,
        "charge": "ch_x",
        "metadata": metadata or {},
    }


def post(
    client,
    event: dict | bytes,
    *,
    secret: str = SECRET,
    ts: int | None = None,
    header: str | None = None,
):
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    headers = {}
    sig = header if header is not None else sign(body, secret, ts)
    if sig:
        headers["HTTP_STRIPE_SIGNATURE"] = sig
    return client.post("/webhooks/stripe/", data=body, content_type="application/json", **headers)


def deliver_and_process(client, event: dict, **kw) -> str:
    from webhooks.models import ProviderEvent
    from webhooks.services import event_process

    response = post(client, event, **kw)
    assert response.status_code == 200, response.content
    return event_process(event_id=ProviderEvent.objects.get(event_id=event["id"]).pk)
