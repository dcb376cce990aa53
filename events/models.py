"""Storefront events and their delivery (docs/events.md).

`Event` is a leaf's model: payments' services write it through `events.record` in the
transaction of the change it reports. Endpoints and deliveries belong to the delivery side
(`events.delivery`), which reads events and never writes one.

No foreign keys into payments: a leaf sits below the core (api_client_id and purchase_id
are plain columns, as recovery's rows name purchases).
"""

from __future__ import annotations

import json
import secrets

from django.db import models
from django.db.models import Q
from django.utils import timezone


def new_event_id() -> str:
    return f"evt_{secrets.token_urlsafe(18)}"


def new_endpoint_id() -> str:
    return f"we_{secrets.token_urlsafe(12)}"


def new_secret_salt() -> str:
    # The signing secret is derived from this and a key from the environment
    # (events.secrets): the database alone never holds a usable secret.
    return secrets.token_urlsafe(24)


class EventType(models.TextChoices):
    # Stable strings: receivers switch on them. Never rename one.
    PURCHASE_CREATED = "purchase.created"
    PURCHASE_STATUS_CHANGED = "purchase.status_changed"
    PURCHASE_COMPLETED = "purchase.completed"
    PAYMENT_SUCCEEDED = "payment.succeeded"
    PAYMENT_FAILED = "payment.failed"
    PAYMENT_UNKNOWN = "payment.unknown"
    PAYMENT_RESOLVED = "payment.resolved"  # an unknown or awaiting payment settled
    CAPTURE_SUCCEEDED = "capture.succeeded"
    CAPTURE_FAILED = "capture.failed"
    CAPTURE_UNKNOWN = "capture.unknown"
    VOID_SUCCEEDED = "void.succeeded"
    VOID_FAILED = "void.failed"
    VOID_UNKNOWN = "void.unknown"
    REFUND_REQUESTED = "refund.requested"
    REFUND_SUCCEEDED = "refund.succeeded"
    REFUND_FAILED = "refund.failed"
    REFUND_UNKNOWN = "refund.unknown"
    DISPUTE_OPENED = "dispute.opened"
    DISPUTE_UPDATED = "dispute.updated"
    DISPUTE_CLOSED = "dispute.closed"
    DELIVERABLE_READY = "deliverable.ready"
    MONEY_MOVED_OUTSIDE = "money.moved_outside_verity"


class Event(models.Model):
    # The feed's cursor: ids grow with insertion (GET /api/v1/events?after=<id>).
    id = models.BigAutoField(primary_key=True)
    public_id = models.CharField(max_length=40, unique=True, default=new_event_id)
    api_client_id = models.CharField(max_length=150, blank=True)
    purchase_id = models.CharField(max_length=40)
    sequence = models.PositiveIntegerField(help_text="per purchase, from 1, no gaps")
    type = models.CharField(max_length=40, choices=EventType.choices)
    data = models.JSONField(help_text="the purchase view as it was, and what changed")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["purchase_id", "sequence"], name="event_sequence_once")
        ]
        indexes = [
            models.Index(fields=["api_client_id", "id"], name="event_feed_idx"),
            models.Index(fields=["created_at"], name="event_created_idx"),
        ]


class PurchaseEventCounter(models.Model):
    """The last sequence number given to a purchase's events: one upsert per write of a
    transaction's events (`INSERT … ON CONFLICT DO UPDATE … RETURNING`), never a
    read-then-write."""

    purchase_id = models.CharField(max_length=40, primary_key=True)
    last = models.PositiveIntegerField(default=0)


class EndpointKind(models.TextChoices):
    # A storefront's endpoint: the events above, signed per Standard Webhooks.
    STANDARD = "standard"
    # An ACP agent platform's order webhook (acp.handlers): its own body and
    # `Merchant-Signature`, the platform's URL and secret (acp.models.AgentPlatform); one per
    # API client, made and kept in step by acp, never through the storefront API.
    ACP = "acp"


class WebhookEndpoint(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_endpoint_id, editable=False)
    api_client_id = models.CharField(max_length=150, db_index=True)
    kind = models.CharField(
        max_length=16, choices=EndpointKind.choices, default=EndpointKind.STANDARD
    )
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True)
    # Empty: every type.
    event_types = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    secret_salt = models.CharField(max_length=64, default=new_secret_salt)
    # Rotation: the previous secret keeps signing (a second signature) until this time.
    previous_secret_salt = models.CharField(max_length=64, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # Since when every attempt failed (cleared by a delivered one): the endpoint is disabled
    # once this is older than WEBHOOK_DISABLE_AFTER_SECONDS.
    failing_since = models.DateTimeField(null=True, blank=True)
    max_in_flight = models.PositiveSmallIntegerField(default=2)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["api_client_id"],
                condition=Q(kind="acp"),
                name="endpoint_one_acp_per_client",
            )
        ]

    def wants(self, event_type: str) -> bool:
        return self.kind == EndpointKind.STANDARD and (
            not self.event_types or event_type in self.event_types
        )


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # retried for the whole retry window; resend starts it again


class WebhookDelivery(models.Model):
    """One event to one endpoint; retried in place (the webhook-id stays the event's, so a
    receiver that dedupes by id takes it once).

    A message of another kind of endpoint (an ACP order event) has no Event: it carries its
    own id (`message_id`, the receiver's dedupe key) and the body as first written, sent
    unchanged on every attempt; it is retried, logged and resent as an event's delivery is."""

    id = models.BigAutoField(primary_key=True)
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.ForeignKey(
        Event, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    message_id = models.CharField(max_length=120, blank=True)
    body = models.TextField(blank=True)
    purchase_id = models.CharField(max_length=40, db_index=True)
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Retries stop at this time (WEBHOOK_RETRY_SECONDS after the first try; a resend moves it).
    give_up_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "event"], name="delivery_once_per_endpoint"
            ),
            models.UniqueConstraint(
                fields=["endpoint", "message_id"],
                condition=Q(event__isnull=True),
                name="delivery_message_once_per_endpoint",
            ),
            models.CheckConstraint(
                condition=Q(event__isnull=False) | ~Q(message_id=""),
                name="delivery_event_or_message",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(state="pending"),
                name="delivery_due_idx",
            )
        ]

    @property
    def msg_id(self) -> str:
        """What the receiver dedupes on: the event's id, or the message's own."""
        return self.event.public_id if self.event is not None else self.message_id

    @property
    def label(self) -> str:
        """What was delivered, for the log: the event's type and sequence, or the ACP
        order event's type and status."""
        if self.event is not None:
            return f"{self.event.type} #{self.event.sequence}"
        try:
            doc = json.loads(self.body)
            return f"acp {doc['type']} {doc['data']['status']}"
        except (ValueError, KeyError, TypeError):
            return self.message_id


class WebhookAttempt(models.Model):
    """The delivery log: one row per POST (what came back, never what was sent)."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    at = models.DateTimeField(default=timezone.now)
