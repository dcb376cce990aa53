from django.db import models


class EventResult(models.TextChoices):
    PENDING = "pending"
    APPLIED = "applied"
    HELD = "held"
    IGNORED = "ignored"
    QUARANTINED = "quarantined"


class ProviderEvent(models.Model):
    event_id = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=100)
    account = models.CharField(max_length=100, blank=True)
    object_id = models.CharField(max_length=100, blank=True, db_index=True)
    created = models.DateTimeField(null=True)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)
    payload = models.JSONField(help_text="safe fields only")
    result = models.CharField(max_length=16, choices=EventResult.choices,
                              default=EventResult.PENDING)
    result_reason = models.CharField(max_length=200, blank=True)
    operation_id = models.CharField(max_length=40, blank=True, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    processed_at = models.DateTimeField(null=True, blank=True)
