"""Shared payment tokens as Stripe grants them to an agent platform (localstripe's test
helper), and their state at the provider."""

from __future__ import annotations

import time

import requests
from django.conf import settings


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
