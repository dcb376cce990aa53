from django.db import models


class EventResult(models.TextChoices):
    PENDING = "pending"
    APPLIED = "applied"
    HELD = "held"
    IGNORED = "ignored"
    QUARANTINED = "quarantined"
    # Signed but malformed (metadata not an object, account not a string): stored, counted,
    # never applied.
    REJECTED = "rejected"


# Results after which processing never runs again on its own (a person may release a
# quarantined event; see webhooks.services.event_quarantine_release).
FINAL_RESULTS = (EventResult.APPLIED, EventResult.IGNORED, EventResult.QUARANTINED,
                 EventResult.REJECTED)


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
    # From the object's metadata at ingestion (unverified until matched): lets a
    # purchase timeline show events that were quarantined before matching an operation.
    purchase_id = models.CharField(max_length=40, blank=True, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["received_at"], condition=models.Q(result="quarantined"),
                         name="providerevent_quarantine_idx"),
            # The console's held-events queue (support.queues), oldest first: as small
            # as the queue, while applied events (most of the table) stay out of it.
            models.Index(fields=["received_at"], condition=models.Q(result="held"),
                         name="providerevent_held_idx"),
        ]
