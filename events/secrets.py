"""Webhook signing secrets: derived, never stored.

secret = "whsec_" + base64(HMAC-SHA256(EVENTS_SECRET_KEY, endpoint id + salt)). The row keeps
the salt; the key comes from the environment. A secret is shown once, when it is made
(endpoint creation, rotation); nothing else returns, logs or renders it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from django.conf import settings


def signing_secret(*, endpoint_id: str, salt: str) -> str:
    digest = hmac.new(
        settings.EVENTS_SECRET_KEY.encode(),
        f"webhook-secret:{endpoint_id}:{salt}".encode(),
        hashlib.sha256,
    ).digest()
    return "whsec_" + base64.b64encode(digest).decode()
