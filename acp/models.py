"""An ACP checkout session: what the agent asked for, the quote that prices it, and the one
purchase it became. Its status is derived from those (acp.sessions), never stored, so it
cannot drift from the purchase's truth; only a cancel before any purchase is recorded here.
"""

from __future__ import annotations

import secrets

from django.db import models


def new_session_id() -> str:
    return f"cs_{secrets.token_hex(12)}"


class CheckoutSession(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_session_id, editable=False)
    api_client = models.ForeignKey(
        "payments.ApiClient", on_delete=models.PROTECT, related_name="acp_sessions"
    )
    currency = models.CharField(max_length=3)
    # As the agent sent them: [{"id": sku, "quantity": n}].
    items = models.JSONField(default=list)
    buyer = models.JSONField(null=True, blank=True)
    fulfillment_details = models.JSONField(null=True, blank=True)
    selected_fulfillment_options = models.JSONField(default=list, blank=True)
    # The latest repricing from the catalogue; None while an item cannot be sold.
    quote = models.ForeignKey(
        "payments.Quote", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Set once, by complete, in the transaction that opens it: a session is ONE purchase.
    purchase = models.OneToOneField(
        "payments.Purchase",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="acp_session",
    )
    canceled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["api_client", "created_at"], name="acp_session_client_idx")]


class AgentPlatform(models.Model):
    """Per agent platform (one API client with the `acp` scope): where it receives its
    order events (the ACP checkout webhook) and the secret they are signed with, and the
    secret its own requests are signed with (optional)."""

    api_client = models.OneToOneField(
        "payments.ApiClient", on_delete=models.CASCADE, related_name="acp_platform"
    )
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret = models.CharField(max_length=200, blank=True)
    # Set: every request of this platform must carry a valid `Signature` + `Timestamp`
    # (acp.views: HMAC-SHA256 over "<Timestamp>.<canonical JSON body>", base64url).
    signing_secret = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
