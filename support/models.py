"""Support: manual resolutions, notes and the audit log — all append-only."""
from django.conf import settings
from django.db import models


class Resolution(models.Model):
    operation_id = models.CharField(max_length=40, db_index=True)
    purchase_id = models.CharField(max_length=40, db_index=True)
    outcome = models.CharField(max_length=24)
    reason = models.TextField()
    actor = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)


class Note(models.Model):
    purchase_id = models.CharField(max_length=40, db_index=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)


class AuditEntry(models.Model):
    """Who did what, when and why. UPDATE/DELETE are refused by a PostgreSQL trigger."""

    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=64, db_index=True)
    purchase_id = models.CharField(max_length=40, blank=True, db_index=True)
    reason = models.TextField()
    detail = models.JSONField(default=dict, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]


class LoginFailure(models.Model):
    """A failed console login, counted per IP and per username to rate-limit guessing.

    Rows live in PostgreSQL (not a per-process cache) so the limit holds across
    gunicorn workers and machines.
    """

    ip = models.GenericIPAddressField(null=True, blank=True)
    username = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["ip", "created_at"], name="loginfail_ip_idx"),
                   models.Index(fields=["username", "created_at"], name="loginfail_user_idx")]
