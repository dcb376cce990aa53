"""Order events to the agent platform (ACP `openapi.agentic_checkout_webhook.yaml`):
`order_create` when an ACP purchase is paid, `order_update` when it moves on.

Written to the outbox by the payments service that saves the purchase's transition, in
its transaction (payments.services.common.purchase_order_event_put: an explicit write,
not a signal receiver). The outbox handler here only turns that fact into a delivery on
the platform's endpoint (an `acp` kind of events.models.WebhookEndpoint, kept in step with
AgentPlatform's URL): from there the storefront webhooks' delivery module sends it — its
claim, retry schedule (backoff for WEBHOOK_RETRY_SECONDS), disabling of an endpoint that
fails for days, halts, delivery log in the console and resend. acp has no retry loop of
its own and never POSTs.

Each event has a stable `Request-Id` (the receiver dedupes on it), its body is fixed when
the event is first put, and every attempt is signed anew
`Merchant-Signature: t=<unix>,v1=HMAC-SHA256(secret, "<t>.<raw body>")` with the
platform's webhook secret (derived from the environment's key and the platform's salt:
AgentPlatform.current_webhook_secret; read when the batch is sent, so a new secret signs at
once).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from events.delivery import Signer, kind_signer_register, message_delivery_create
from events.models import EndpointKind, WebhookEndpoint
from payments.api.presenters import status_url
from recovery.models import OutboxCategory
from recovery.outbox import outbox_handler

from .models import AgentPlatform, CheckoutSession
from .sessions import order_status

NO_WEBHOOK = "the platform receives no order webhooks (acp_platform --webhook-url)"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def order_event_id(payload: dict) -> str:
    """The event's `Request-Id`: one per (purchase, status entered, how many times)."""
    return f"evt_{payload['purchase']}_{payload['status']}" + (
        f"_{payload['n']}" if "n" in payload else ""
    )


def platform_endpoint_sync(platform: AgentPlatform) -> WebhookEndpoint | None:
    """The platform's order-webhook endpoint, made on first need and kept at its URL. A
    platform without a URL has none enabled (turned off with that reason; a URL set again
    turns it back on). Returns the endpoint (None: the platform receives no order events);
    one disabled for failures is returned as it is, and takes no delivery until enabled."""
    client_id = str(platform.api_client_id)
    current = WebhookEndpoint.objects.filter(kind=EndpointKind.ACP, api_client_id=client_id).first()
    if (
        current is not None
        and platform.webhook_url
        and current.url == platform.webhook_url
        and current.disabled_reason != NO_WEBHOOK
    ):
        return current  # in step already (every order event asks): no lock taken
    with transaction.atomic():
        endpoint = (
            WebhookEndpoint.objects.select_for_update()
            .filter(kind=EndpointKind.ACP, api_client_id=client_id)
            .first()
        )
        if endpoint is None:
            if not platform.webhook_url:
                return None
            return WebhookEndpoint.objects.create(
                kind=EndpointKind.ACP,
                api_client_id=client_id,
                url=platform.webhook_url,
                description="ACP order webhook",
            )
        if not platform.webhook_url:
            if endpoint.enabled:
                endpoint.enabled = False
                endpoint.disabled_at = timezone.now()
                endpoint.disabled_reason = NO_WEBHOOK
                endpoint.save(
                    update_fields=["enabled", "disabled_at", "disabled_reason", "updated_at"]
                )
            return None
        if endpoint.url != platform.webhook_url or endpoint.disabled_reason == NO_WEBHOOK:
            endpoint.url = platform.webhook_url
            fields = ["url", "updated_at"]
            if endpoint.disabled_reason == NO_WEBHOOK:
                endpoint.enabled, endpoint.disabled_at, endpoint.disabled_reason = True, None, ""
                fields += ["enabled", "disabled_at", "disabled_reason"]
            endpoint.save(update_fields=fields)
    return endpoint


@outbox_handler(OutboxCategory.ACP_ORDER_EVENT)
def _order_event_put(payload: dict) -> None:
    """The order moved: one delivery on the platform's endpoint (never a POST here)."""
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
    if platform is None:
        return  # the platform receives no webhooks (it polls the session)
    endpoint = platform_endpoint_sync(platform)
    if endpoint is None:
        return
    body = json.dumps(
        {
            "type": payload["event"],
            "data": {
                "type": "order",
                "id": session.purchase_id,
                "checkout_session_id": session.id,
                "permalink_url": status_url(purchase),
                "status": order_status(payload["status"], purchase.id),
            },
        },
        separators=(",", ":"),
    ).encode()
    message_delivery_create(
        endpoint=endpoint,
        message_id=order_event_id(payload),
        purchase_id=purchase.id,
        body=body,
    )


def _acp_signer(endpoint: WebhookEndpoint) -> Signer | None:
    platform = AgentPlatform.objects.filter(api_client_id=endpoint.api_client_id).first()
    secret = platform.current_webhook_secret() if platform is not None else ""
    if not secret:
        return None

    def headers(msg_id: str, body: bytes, at: datetime) -> dict[str, str]:
        now = int(at.timestamp())
        return {
            "Merchant-Signature": sign(secret, now, body),
            # Stable across retries: the receiver's dedupe key.
            "Request-Id": msg_id,
            "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        }

    return headers


kind_signer_register(EndpointKind.ACP, _acp_signer)
