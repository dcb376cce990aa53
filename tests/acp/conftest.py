"""ACP fixtures: an agent platform's API client (scope `acp`), an HTTP agent speaking the
protocol, and shared payment tokens issued at localstripe (the launcher's test helper)."""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from django.conf import settings

from acp.spec import API_VERSION, _validator
from tests.factories import ProductFactory, make_client


class AcpAgent:
    """An ACP agent platform over real HTTP: Bearer key, API-Version, a Request-Id each."""

    def __init__(self, base: str, api_key: str) -> None:
        self.base = f"{base}/acp"
        self.http = requests.Session()
        self.http.headers.update({"Authorization": f"Bearer {api_key}", "API-Version": API_VERSION})
        self.log: list[tuple[str, int | str]] = []

    def post(
        self,
        path: str,
        body: dict | None,
        *,
        key: str | None = "auto",
        timeout: float = 20.0,
        **headers,
    ):
        if key == "auto":
            key = str(uuid.uuid4())
        if key is not None:
            headers["Idempotency-Key"] = key
        headers.setdefault("Request-Id", f"req_{uuid.uuid4().hex[:10]}")
        try:
            r = self.http.post(f"{self.base}/{path}", json=body, headers=headers, timeout=timeout)
        except requests.exceptions.Timeout:
            self.log.append((path, "timeout"))
            return None
        self.log.append((path, r.status_code))
        return r

    def get(self, path: str, **headers):
        r = self.http.get(f"{self.base}/{path}", headers=headers, timeout=20)
        self.log.append((path, r.status_code))
        return r

    def post_until_not_in_flight(self, path: str, body: dict, *, key: str):
        deadline = time.monotonic() + 30
        while True:
            r = self.post(path, body, key=key)
            if r.status_code != 409 or r.json()["code"] != "idempotency_in_flight":
                return r
            assert int(r.headers["Retry-After"]) >= 1
            assert time.monotonic() < deadline, "complete stayed in flight"
            time.sleep(0.1)

    # -- the protocol's steps --------------------------------------------------------
    def create(self, sku: str, quantity: int = 1, **kw):
        return self.post(
            "checkout_sessions",
            {
                "line_items": [{"id": sku, "quantity": quantity}],
                "currency": "usd",
                "capabilities": {"interventions": {"supported": []}},
            },
            **kw,
        )

    def complete(self, session_id: str, token: str, email: str, **kw):
        return self.post(
            f"checkout_sessions/{session_id}/complete", complete_body(token, email), **kw
        )


def complete_body(token: str, email: str) -> dict:
    return {
        "buyer": {"first_name": "Ada", "email": email},
        "payment_data": {"provider": "stripe", "token": token},
    }


def valid(schema: str, body: dict) -> dict:
    """The answer is the spec's shape (the patched OpenAPI under acp/spec)."""
    errors = [e.message for e in _validator(schema).iter_errors(body)]
    assert not errors, (schema, errors[:5], body)
    return body


def issue_spt(
    amount: int,
    *,
    currency: str = "usd",
    expires_in: int = 3600,
    payment_method: str = "pm_card_visa",
) -> str:
    """What the agent platform gets from Stripe for this merchant (delegate payment)."""
    r = requests.post(
        f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/test_helpers/shared_payment/granted_tokens",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
        data={
            "payment_method": payment_method,
            "usage_limits[currency]": currency,
            "usage_limits[max_amount]": amount,
            "usage_limits[expires_at]": int(time.time()) + expires_in,
        },
    )
    assert r.status_code == 200, r.text
    token = r.json()
    assert token["id"].startswith("spt_") and token["object"] == "shared_payment.granted_token"
    return token["id"]


def spt_state(token: str) -> dict:
    r = requests.get(
        f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/shared_payment/granted_tokens/{token}",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def platform(transactional_db):
    """The agent platform's Verity API client: the `acp` scope only."""
    return make_client(scopes=("acp",), limit=10_000_000, name="agent-platform")


@pytest.fixture
def agent(live_server, platform):
    return AcpAgent(live_server.url, platform[1])


@pytest.fixture
def tea(transactional_db):
    return ProductFactory(sku=f"TEA-{uuid.uuid4().hex[:6]}", price=1250, stock=100)


def new_email() -> str:
    return f"buyer-{uuid.uuid4().hex[:8]}@example.com"
