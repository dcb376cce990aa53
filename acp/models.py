"""An ACP checkout session: what the agent asked for, the quote that prices it, and the one
purchase it became. Its status is derived from those (acp.sessions), never stored, so it
cannot drift from the purchase's truth; only a cancel before any purchase is recorded here.
"""

from __future__ import annotations

import secrets

from django.db import models

from events.secrets import derived_secret


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
    order events (the ACP checkout webhook), and the salts its two secrets are derived
    from: the one its order webhooks are signed with and the one its own requests are
    signed with (optional). A secret is never stored: it is derived from EVENTS_SECRET_KEY
    (the environment), the row's id and the salt (events.secrets), shown once by
    `acp_platform` when it is made; a new salt is a new secret."""

    api_client = models.OneToOneField(
        "payments.ApiClient", on_delete=models.CASCADE, related_name="acp_platform"
    )
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret_salt = models.CharField(max_length=64, blank=True)
    # Set: every request of this platform must carry a valid `Signature` + `Timestamp`
    # (acp.views: HMAC-SHA256 over "<Timestamp>.<canonical JSON body>", base64url). Blank:
    # its requests are not signed.
    signing_secret_salt = models.CharField(max_length=64, blank=True)
    # Secrets stored in clear by the code before they were derived. Each is used only until
    # `acp_platform` rotates that secret (which empties it: a platform verifying with it
    # would fail if it changed silently); the `verity.W001` check lists the platforms that
    # still hold one. Never written otherwise.
    legacy_webhook_secret = models.CharField(max_length=200, blank=True)
    legacy_signing_secret = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def current_webhook_secret(self) -> str:
        """What signs its order webhooks now ("": nothing can)."""
        if self.legacy_webhook_secret:
            return self.legacy_webhook_secret
        if not self.webhook_secret_salt:
            return ""
        return derived_secret(
            purpose="acp-webhook", owner_id=self.pk, salt=self.webhook_secret_salt, prefix="whsec_"
        )

    def current_signing_secret(self) -> str:
        """What its requests must be signed with ("": signing is off)."""
        if self.legacy_signing_secret:
            return self.legacy_signing_secret
        if not self.signing_secret_salt:
            return ""
        return derived_secret(
            purpose="acp-request", owner_id=self.pk, salt=self.signing_secret_salt, prefix="sigsec_"
        )
