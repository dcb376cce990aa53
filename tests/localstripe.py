"""localstripe as a test sees it over plain HTTP (not through Verity's adapter): its
objects, its clock and its idempotency-key layer."""

from __future__ import annotations

import requests


class Localstripe:
    """Counts objects at the fake provider over plain HTTP (not through Verity's adapter)."""

    def __init__(self, base: str, key: str) -> None:
        self.base = base.rstrip("/")
        self.auth = (key, "")

    def list(self, resource: str, **params) -> list[dict]:
        params.setdefault("limit", 100)
        out, starting_after = [], None
        while True:
            if starting_after:
                params["starting_after"] = starting_after
            r = requests.get(
                f"{self.base}/v1/{resource}", params=params, auth=self.auth, timeout=10
            )
            r.raise_for_status()
            body = r.json()
            out.extend(body["data"])
            if not body.get("has_more") or not body["data"]:
                return out
            starting_after = body["data"][-1]["id"]

    def payment_intents_for(self, purchase_id: str) -> list[dict]:
        return [
            pi
            for pi in self.list("payment_intents")
            if (pi.get("metadata") or {}).get("purchase_id") == purchase_id
        ]

    def succeeded_charges_for(self, purchase_id: str) -> list[dict]:
        return [
            pi
            for pi in self.payment_intents_for(purchase_id)
            if pi["status"] in ("succeeded", "requires_capture")
        ]

    def refunds_for(self, payment_intent_id: str) -> list[dict]:
        return [r for r in self.list("refunds") if r.get("payment_intent") == payment_intent_id]

    def flush(self) -> None:
        requests.delete(f"{self.base}/_config/data", timeout=10)

    def clock_offset(self, seconds: float) -> None:
        """Move the launcher's `Date` header this far ahead of the machine's clock."""
        r = requests.post(
            f"{self.base}/_config/clock", data={"offset_seconds": seconds}, timeout=10
        )
        r.raise_for_status()

    def clock_date(self, raw: str) -> None:
        """Send this raw `Date` header ("" goes back to the machine's clock)."""
        r = requests.post(f"{self.base}/_config/clock", data={"date": raw}, timeout=10)
        r.raise_for_status()

    def idempotency(self, **config) -> dict:
        """Stripe's idempotency-key layer of the launcher (tools/localstripe_server.py):
        enabled, window_seconds, hold_seconds, flush. Returns its state."""
        r = requests.post(f"{self.base}/_config/idempotency", data=config, timeout=10)
        r.raise_for_status()
        return r.json()


def one_call_on(localstripe: Localstripe, settings_) -> None:
    """The provider dedupes keys (localstripe's idempotency layer on) and Verity pays in one
    round trip (STRIPE_DEDUPES_KEYS)."""
    localstripe.idempotency(enabled="true", window_seconds=86400, hold_seconds=0, flush="true")
    settings_.STRIPE_DEDUPES_KEYS = True


def one_call_off(localstripe: Localstripe) -> None:
    localstripe.idempotency(enabled="false", window_seconds=86400, hold_seconds=0, flush="true")


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
