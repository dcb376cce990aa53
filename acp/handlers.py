"""Order events to the agent platform (ACP `openapi.agentic_checkout_webhook.yaml`):
`order_create` when an ACP purchase is paid, `order_update` when it moves on.

Written to the outbox by the payments service that saves the purchase's transition, in
its transaction (payments.services.common.purchase_order_event_put: an explicit write,
not a signal receiver), and delivered here by the relay with no transaction open: at
least once, with the relay's capped backoff; a delivery that keeps failing stays in the console's
stuck-outbox queue with its error.
Each event has a stable `Request-Id` (the receiver dedupes on it) and is signed
`Merchant-Signature: t=<unix>,v1=HMAC-SHA256(secret, "<t>.<raw body>")`.

The POST itself is the storefront webhooks' one (events.destinations.post_checked): the
platform's URL is checked against private, loopback and link-local addresses at send time
and the connection goes to the address that was checked (DNS rebinding), no redirects,
timeouts, a bounded read of the answer. The retry schedule and the log are still the
outbox's (docs/events.md says what is left to share).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

from events.destinations import post_checked
from payments.api.presenters import status_url
from recovery.models import OutboxCategory
from recovery.outbox import outbox_handler

from .models import AgentPlatform, CheckoutSession
from .sessions import order_status


class DeliveryFailed(Exception):
    """The platform did not take the event (not 2xx, or unreachable): back off, retry."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


@outbox_handler(OutboxCategory.ACP_ORDER_EVENT)
def _deliver_order_event(payload: dict) -> None:
    session = (
        CheckoutSession.objects.select_related("purchase")
        .filter(purchase_id=payload["purchase"])
        .first()
    )
    if session is None:
        return  # not a session's purchase: nothing to tell
    purchase = session.purchase
    assert purchase is not None  # found by its purchase
    platform = AgentPlatform.objects.filter(api_client_id=session.api_client_id).first()
    if platform is None or not platform.webhook_url:
        return  # the platform receives no webhooks (it polls the session)
    body = json.dumps(
        {
            "type": payload["event"],
            "data": {
                "type": "order",
                "id": session.purchase_id,
                "checkout_session_id": session.id,
                "permalink_url": status_url(purchase),
                "status": order_status(payload["status"]),
            },
        },
        separators=(",", ":"),
    ).encode()
    now = int(time.time())
    result = post_checked(
        platform.webhook_url,
        body=body,
        headers={
            "Merchant-Signature": sign(platform.webhook_secret, now, body),
            # Stable across retries: the receiver's dedupe key.
            "Request-Id": f"evt_{session.purchase_id}_{payload['status']}"
            + (f"_{payload['n']}" if "n" in payload else ""),
            "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        },
    )
    if result.status is None:
        raise DeliveryFailed(f"{platform.webhook_url}: {result.error}")
    if not result.ok:
        raise DeliveryFailed(f"{platform.webhook_url} answered {result.status}")
