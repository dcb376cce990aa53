"""The storefront API as a test speaks it: a DRF test client with an API key (Api), its
scopes, fresh idempotency keys, request bodies, and what a crashed request leaves."""

from __future__ import annotations

import json
import uuid

from rest_framework.test import APIClient

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


def body_of(response) -> dict:
    return json.loads(response.content)
