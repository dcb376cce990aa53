"""Storefront API fixtures: API clients with keys, a catalogue, and small request helpers."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from tests.factories import make_client

ALL_SCOPES = ("purchases:read", "purchases:write", "refunds:write")


def new_key() -> str:
    return f"test-{uuid.uuid4()}"


class Api:
    """A DRF test client speaking as one API client (in-process, same DB connection)."""

    def __init__(self, key: str, client_obj=None) -> None:
        self.key = key
        self.client = client_obj
        self.http = APIClient()
        self.http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")

    def get(self, path: str, **headers):
        return self.http.get(f"/api/v1/{path}", **headers)

    def post(self, path: str, body=None, *, key: str | None = "auto", **headers):
        extra = dict(headers)
        if key == "auto":
            key = new_key()
        if key is not None:
            extra["HTTP_IDEMPOTENCY_KEY"] = key
        return self.http.post(
            f"/api/v1/{path}", body if body is not None else {}, format="json", **extra
        )

    # -- the happy path in three calls ------------------------------------------------
    def quote(self, sku: str, quantity: int = 1, **kw):
        return self.post(
            "quotes", {"items": [{"sku": sku, "quantity": quantity}], "currency": "usd"}, **kw
        )

    def purchase(self, quote: dict, customer: str | None = None, **kw):
        body = {
            "quote_id": quote["id"],
            "quote_version": quote["version"],
            "customer": {
                "reference": customer or f"cust-{uuid.uuid4().hex[:10]}",
                "email": "buyer@example.com",
            },
        }
        body.update(kw.pop("extra", {}))
        return self.post("purchases", body, **kw)

    def new_purchase(self, sku: str, customer: str | None = None) -> dict:
        q = self.quote(sku)
        assert q.status_code == 201, q.content
        p = self.purchase(q.json(), customer)
        assert p.status_code == 201, p.content
        return p.json()

    def pay(self, purchase_id: str, method: str = "pm_card_visa", **kw):
        body = {"payment_method": method, "capture": kw.pop("capture", "automatic")}
        body.update(kw.pop("extra", {}))
        return self.post(f"purchases/{purchase_id}/payments", body, **kw)


def settle_outbox(timeout: float = 15.0) -> None:
    """Let follow-up work a test committed finish before the database is flushed.

    A payment writes outbox rows and kicks the relay on commit; the session's Celery worker
    (if a test started it) may be handling them when pytest-django truncates the tables,
    and TRUNCATE against a worker's row locks deadlocks — leaving data behind for every
    later test. So: drain what is due here (the relay's claims are SKIP LOCKED, safe next
    to the worker) until nothing is due or being handled.
    """
    import time

    from django.db import connection
    from django.db.models import Q
    from django.utils import timezone

    if connection.in_atomic_block:
        return  # a rolled-back test: nothing was committed, nothing was kicked
    from recovery.models import OutboxMessage
    from recovery.relay import relay_drain_once

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        relay_drain_once()
        now = timezone.now()
        busy = OutboxMessage.objects.filter(processed_at__isnull=True).filter(
            Q(available_at__lte=now) | Q(claimed_until__gt=now)
        )
        if not busy.exists():
            return
        time.sleep(0.05)


@pytest.fixture
def other_storefront(db):
    client, key = make_client(scopes=ALL_SCOPES, limit=10_000_000, name="other")
    return Api(key, client)


@pytest.fixture
def reader(db):
    client, key = make_client(scopes=("purchases:read",), name="reader")
    return Api(key, client)


@pytest.fixture
def ops_tool(db):
    client, key = make_client(
        scopes=("purchases:read", "purchases:write", "operations:resolve"), name="ops-tool"
    )
    return Api(key, client)


def payment_body(method: str = "pm_card_visa", capture: str = "automatic", **extra) -> dict:
    return {"payment_method": method, "capture": capture, **extra}


def leave_crashed_payment_request(api: Api, purchase_id: str, key: str, body: dict):
    """What a web process that died right after creating the operation leaves behind: the
    operation (pending, never sent) and the in-flight key record bound to it, lease over."""
    from datetime import timedelta

    from django.utils import timezone

    from payments import services
    from payments.api.idempotency import request_fingerprint
    from payments.models import IdempotencyRecord

    op = services.payment_create(
        purchase_id=purchase_id,
        api_client=api.client,
        payment_method=body["payment_method"],
        capture_method=body.get("capture", "automatic"),
    )
    IdempotencyRecord.objects.create(
        api_client=api.client,
        route="purchases_payments_create",
        key=key,
        fingerprint=request_fingerprint(
            path=f"/api/v1/purchases/{purchase_id}/payments", body=body
        ),
        state=IdempotencyRecord.State.IN_FLIGHT,
        lease_until=timezone.now() - timedelta(seconds=1),
        resource_type="operation",
        resource_id=op.id,
    )
    return op
