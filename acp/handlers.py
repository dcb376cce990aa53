"""Order events to the agent platform (ACP `openapi.agentic_checkout_webhook.yaml`):
`order_create` when an ACP purchase is paid, `order_update` when it moves on.

Written to the outbox in the transaction that moves the purchase (django-fsm's
post_transition on Purchase, so the core does not know about ACP), and delivered by the
relay with no transaction open: at least once, with the relay's capped backoff; a
delivery that keeps failing stays in the console's stuck-outbox queue with its error.
Each event has a stable `Request-Id` (the receiver dedupes on it) and is signed
`Merchant-Signature: t=<unix>,v1=HMAC-SHA256(secret, "<t>.<raw body>")`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time

import requests
from django.db import transaction
from django_fsm.signals import post_transition

from payments.enums import PurchaseStatus
from payments.models import Purchase, PurchaseChannel
from payments.api.presenters import status_url
from recovery.models import OutboxCategory
from recovery.outbox import outbox_handler, outbox_put

from .models import AgentPlatform, CheckoutSession

DELIVERY_TIMEOUT_SECONDS = 5
# The purchase's status once paid -> the order status the platform sees.
_ORDER_STATUS = {PurchaseStatus.PAID: "confirmed", PurchaseStatus.FULFILLING: "processing",
                 PurchaseStatus.COMPLETED: "completed", PurchaseStatus.REFUND_PENDING:
                 "refund_pending", PurchaseStatus.REFUNDED: "refunded",
                 PurchaseStatus.DISPUTED: "disputed", PurchaseStatus.DISPUTE_WON: "completed",
                 PurchaseStatus.DISPUTE_LOST: "refunded", PurchaseStatus.VOIDED: "canceled"}


class DeliveryFailed(Exception):
    """The platform did not take the event (not 2xx, or unreachable): back off, retry."""


def _on_purchase_transition(sender, instance, name, source, target, **kwargs) -> None:
    if getattr(instance, "channel", None) != PurchaseChannel.ACP or target == source:
        return
    if target not in _ORDER_STATUS or kwargs.get("exception") is not None:
        return
    event = "order_create" if target == PurchaseStatus.PAID and source not in _ORDER_STATUS \
        else "order_update"

    def put():
        outbox_put(category=OutboxCategory.ACP_ORDER_EVENT,
                   payload={"purchase": instance.pk, "event": event, "status": str(target)},
                   dedupe_key=f"acp-order:{instance.pk}:{target}")

    # Transitions are saved inside the service's transaction; the event commits with it.
    if transaction.get_connection().in_atomic_block:
        put()
    else:
        with transaction.atomic():
            put()


post_transition.connect(_on_purchase_transition, sender=Purchase,
                        dispatch_uid="acp-order-events")


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
        "status": _ORDER_STATUS.get(payload["status"], payload["status"])}},
        separators=(",", ":")).encode()
    now = int(time.time())
    try:
        r = requests.post(platform.webhook_url, data=body, timeout=DELIVERY_TIMEOUT_SECONDS,
                          allow_redirects=False, headers={
                              "Content-Type": "application/json",
                              "Merchant-Signature": sign(platform.webhook_secret, now, body),
                              # Stable across retries: the receiver's dedupe key.
                              "Request-Id": f"evt_{session.purchase_id}_{payload['status']}",
                              "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                         time.gmtime(now))})
    except requests.RequestException as exc:
        raise DeliveryFailed(f"{platform.webhook_url}: {type(exc).__name__}") from None
    if not 200 <= r.status_code < 300:
        raise DeliveryFailed(f"{platform.webhook_url} answered {r.status_code}")
