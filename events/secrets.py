"""Signing secrets: derived, never stored.

secret = prefix + base64(HMAC-SHA256(EVENTS_SECRET_KEY, "<purpose>:<owner id>:<salt>")). The
row keeps the salt; the key comes from the environment. A secret is shown once, when it is
made (creation, rotation); nothing else returns, logs or renders it. The purpose keeps the
secrets of different uses apart: a storefront endpoint's ("webhook-secret"), an agent
platform's order webhooks ("acp-webhook") and its own requests ("acp-request", acp.models).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from django.conf import settings


def derived_secret(*, purpose: str, owner_id: str | int, salt: str, prefix: str) -> str:
    digest = hmac.new(
        settings.EVENTS_SECRET_KEY.encode(),
        f"{purpose}:{owner_id}:{salt}".encode(),
        hashlib.sha256,
    ).digest()
    return prefix + base64.b64encode(digest).decode()


def signing_secret(*, endpoint_id: str, salt: str) -> str:
    """A storefront webhook endpoint's (Standard Webhooks) secret."""
    return derived_secret(
        purpose="webhook-secret", owner_id=endpoint_id, salt=salt, prefix="whsec_"
    )
