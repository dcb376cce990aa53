"""API client services (storefront credentials)."""

from __future__ import annotations

from django.db import transaction

from .models import ApiClient

SCOPES = (
    "purchases:read",
    "purchases:write",
    "refunds:write",
    "operations:resolve",
    "acp",  # acp: the Agentic Commerce Protocol checkout (acp/), an agent platform
    "webhooks:manage",
)  # its webhook endpoints (events/, docs/events.md)


def api_client_create(
    *,
    name: str,
    scopes: list[str],
    limit: int = 0,
    currency: str = "usd",
    limit_period: str = "none",
    auto_refund_limit: int = 0,
    storefront_confirmation: bool = False,
) -> tuple[ApiClient, str]:
    """Create a client; returns the plaintext key, which is never stored (only its hash)."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scopes: {', '.join(unknown)}")
    if limit < 0:
        raise ValueError("limit must be >= 0")
    with transaction.atomic():
        client, key = ApiClient.objects.create_key(
            name=name,
            scopes=list(scopes),
            spending_limit=limit,
            currency=currency.lower(),
            limit_period=limit_period,
            auto_refund_limit=auto_refund_limit,
            storefront_confirmation=storefront_confirmation,
        )
    assert isinstance(client, ApiClient)  # the library's create_key types its base class
    return client, key
