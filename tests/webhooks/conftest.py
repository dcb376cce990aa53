"""Helpers for webhook tests: sign events ourselves (HMAC-SHA256 over "<t>.<body>",
exactly what Stripe and localstripe do) and build operations to match against."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time

import pytest

SECRET = "whsec_test_current"
OLD_SECRET = "whsec_test_previous"


@pytest.fixture(autouse=True)
def webhook_secrets(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET, OLD_SECRET]
    settings.STRIPE_WEBHOOK_TOLERANCE = 300
    settings.STRIPE_ACCOUNT = ""
    return settings.STRIPE_WEBHOOK_SECRETS


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


# -- real operations through the payments services -----------------------------------


@pytest.fixture
def pay(api_client, drill):
    """pay(purchase, drop_response=False, method=..., capture=...) -> dispatched operation.
    With drop_response the provider really applies the confirm but the answer is lost:
    the operation is `unknown` and only evidence (a webhook, a read-back) can settle it."""
    from payments import services

    def run(purchase, *, drop_response=False, method="pm_card_visa", capture="automatic"):
        op = services.payment_create(
            purchase_id=purchase.id,
            api_client=api_client,
            payment_method=method,
            capture_method=capture,
        )
        if drop_response:
            drill(op, "drop_response_after_send", step="confirm")
        return services.operation_dispatch(operation_id=op.id)

    return run


def provider_object(resource: str, object_id: str) -> dict:
    """The object as localstripe holds it right now (plain HTTP, not Verity's adapter)."""
    import requests
    from django.conf import settings

    r = requests.get(
        f"{settings.STRIPE_API_BASE}/v1/{resource}/{object_id}",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    return r.json()


def deliver_and_process(client, event: dict, **kw) -> str:
    from webhooks.models import ProviderEvent
    from webhooks.services import event_process

    response = post(client, event, **kw)
    assert response.status_code == 200, response.content
    return event_process(event_id=ProviderEvent.objects.get(event_id=event["id"]).pk)


# -- a relay worker of another test may be alive (the celery_worker fixture is
# session-scoped): let it finish before the test database is flushed, or its writes
# deadlock the TRUNCATE.


def _celery_worker_alive() -> bool:
    import os
    from pathlib import Path

    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[1] != me:
                continue
            if b"celery" in (proc / "cmdline").read_bytes():
                return True
        except (OSError, IndexError):
            continue
    return False


@pytest.fixture(autouse=True)
def _quiet_worker_before_flush(request):
    yield
    marker = request.node.get_closest_marker("django_db")
    if not (marker and marker.kwargs.get("transaction")) or not _celery_worker_alive():
        return
    from django.utils import timezone

    from recovery.models import OutboxMessage
    from tests.conftest import wait_for

    def idle():
        now = timezone.now()
        return not OutboxMessage.objects.filter(
            processed_at__isnull=True, available_at__lte=now, attempts__lt=3
        ).exists()

    try:
        wait_for(idle, timeout=15)
    except AssertionError:
        pass  # a message that keeps failing: the flush may still succeed
