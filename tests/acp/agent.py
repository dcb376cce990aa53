"""An ACP agent platform as a test plays it: its HTTP client (AcpAgent), the bodies it
sends, and the spec's check on the answers it gets."""

from __future__ import annotations

import time
import uuid

import requests

from acp.spec import API_VERSION, _validator


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


def new_email() -> str:
    return f"buyer-{uuid.uuid4().hex[:8]}@example.com"
