"""Order events to the agent platform (ACP `openapi.agentic_checkout_webhook.yaml`):
`order_create` when an ACP purchase is paid, `order_update` when it moves on.

Written to the outbox by the payments service that saves the purchase's transition, in
its transaction (payments.services.common.purchase_order_event_put: an explicit write,
not a signal receiver), and delivered here by the relay with no transaction open: at
least once, with the relay's capped backoff; a delivery that keeps failing stays in the console's stuck-outbox queue with its error.
Each event has a stable `Request-Id` (the receiver dedupes on it) and is signed
`Merchant-Signature: t=<unix>,v1=HMAC-SHA256(secret, "<t>.<raw body>")`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time

import requests

from payments.api.presenters import status_url
from recovery.models import OutboxCategory
from recovery.outbox import outbox_handler

from .models import AgentPlatform, CheckoutSession
from .sessions import order_status

DELIVERY_TIMEOUT_SECONDS = 5
class DeliveryFailed(Exception):
    """The platform did not take the event (not 2xx, or unreachable): back off, retry."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


@outbox_handler(OutboxCategory.ACP_ORDER_EVENT)
def _deliver_order_event(payload: dict) -> None:
    session = (CheckoutSession.objects.select_related("purchase")
               .filter(purchase_id=payload["purchase"]).first())
    if session is None:
        return  # not a session's purchase: nothing to tell
    platform = AgentPlatform.objects.filter(api_client_id=session.api_client_id).first()
    if platform is None or not platform.webhook_url:
        return  # the platform receives no webhooks (it polls the session)
    body = json.dumps({"type": payload["event"], "data": {
        "type": "order", "id": session.purchase_id, "checkout_session_id": session.id,
        "permalink_url": status_url(session.purchase),
        "status": order_status(payload["status"])}},
        separators=(",", ":")).encode()
    now = int(time.time())
    try:
        r = requests.post(platform.webhook_url, data=body, timeout=DELIVERY_TIMEOUT_SECONDS,
                          allow_redirects=False, headers={
                              "Content-Type": "application/json",
                              "Merchant-Signature": sign(platform.webhook_secret, now, body),
                              # Stable across retries: the receiver's dedupe key.
                              "Request-Id": f"evt_{session.purchase_id}_{payload['status']}"
                                            + (f"_{payload['n']}" if "n" in payload else ""),
                              "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                         time.gmtime(now))})
    except requests.RequestException as exc:
        raise DeliveryFailed(f"{platform.webhook_url}: {type(exc).__name__}") from None
    if not 200 <= r.status_code < 300:
        raise DeliveryFailed(f"{platform.webhook_url} answered {r.status_code}")
