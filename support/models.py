"""Support: console login limits and incidents. The audit log, resolutions and notes
live in the `audit` leaf app (re-exported here for the console's callers)."""

from django.conf import settings
from django.db import models

from audit.models import AuditEntry, Note, Resolution

__all__ = [
    "AuditEntry",
    "FormSubmission",
    "Incident",
    "IncidentItem",
    "IncidentOutcome",
    "IncidentStatus",
    "LoginFailure",
    "Note",
    "Resolution",
]


class LoginFailure(models.Model):
    """A failed console login, counted per IP and per username to rate-limit guessing.

    Rows live in PostgreSQL (not a per-process cache) so the limit holds across
    gunicorn workers and machines.
    """

    ip = models.GenericIPAddressField(null=True, blank=True)
    username = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [
            models.Index(fields=["ip", "created_at"], name="loginfail_ip_idx"),
            models.Index(fields=["username", "created_at"], name="loginfail_user_idx"),
        ]


class IncidentStatus(models.TextChoices):
    OPEN = "open"
    CLOSED = "closed"


class IncidentOutcome(models.TextChoices):
    """The final outcome per purchase, recorded when the incident closes (the seed
    article: completed forward, compensated, or manual reconciliation)."""

    COMPLETED_FORWARD = "completed_forward"
    COMPENSATED = "compensated"
    MANUAL = "manual"


class Incident(models.Model):
    """An operator-run incident: the purchases/operations it affects, the halts set from
    it, and on close the final outcome per purchase plus a short review. Every change is
    also an AuditEntry (target_type "incident") written in the same transaction."""

    title = models.CharField(max_length=200)
    summary = models.TextField()
    status = models.CharField(
        max_length=8, choices=IncidentStatus.choices, default=IncidentStatus.OPEN, db_index=True
    )
    opened_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    opened_at = models.DateTimeField(auto_now_add=True)
    halts = models.JSONField(default=list, blank=True)  # halt names set from this incident
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    closed_at = models.DateTimeField(null=True, blank=True)
    review = models.TextField(blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]


class IncidentItem(models.Model):
    """A purchase (and optionally one of its operations) attached to an incident."""

    incident = models.ForeignKey(Incident, on_delete=models.PROTECT, related_name="items")
    purchase_id = models.CharField(max_length=40, db_index=True)
    operation_id = models.CharField(max_length=40, blank=True)
    attached_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    attached_at = models.DateTimeField(auto_now_add=True)
    final_outcome = models.CharField(max_length=24, choices=IncidentOutcome.choices, blank=True)

    class Meta:
        ordering = ["attached_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["incident", "purchase_id", "operation_id"],
                name="incidentitem_once_per_incident",
            )
        ]


class FormSubmission(models.Model):
    """A console form that moves money, submitted once: the page mints a one-time token
    (support.services.form_token_mint); the action inserts its nonce here in the
    transaction that makes its effect. A second POST of the same form (a double click, a
    resent request) meets the unique nonce — PostgreSQL makes it wait for the first
    transaction, then refuses it — and is shown the first one's result; it creates
    nothing."""

    nonce = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=64)
    target_id = models.CharField(max_length=40)
    result_type = models.CharField(max_length=16, blank=True)  # "operation" | "purchase"
    result_id = models.CharField(max_length=40, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
