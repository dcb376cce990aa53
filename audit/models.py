"""The append-only audit log, manual resolutions and notes: a leaf every app may write to.

The tables keep their first names (`support_*`, where they were created): the
append-only triggers of support/migrations/0002 are bound to them and still refuse
UPDATE and DELETE (tests/support/test_audit_append_only.py)."""

from django.conf import settings
from django.db import models


class Resolution(models.Model):
    operation_id = models.CharField(max_length=40, db_index=True)
    purchase_id = models.CharField(max_length=40, db_index=True)
    outcome = models.CharField(max_length=24)
    reason = models.TextField()
    actor = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "support_resolution"


class Note(models.Model):
    purchase_id = models.CharField(max_length=40, db_index=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "support_note"


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
        db_table = "support_auditentry"
        ordering = ["created_at", "id"]
