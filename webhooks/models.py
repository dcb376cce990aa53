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
FINAL_RESULTS = (
    EventResult.APPLIED,
    EventResult.IGNORED,
    EventResult.QUARANTINED,
    EventResult.REJECTED,
)


class ProviderEvent(models.Model):
    event_id = models.CharField(max_length=100)
    type = models.CharField(max_length=100)
    account = models.CharField(max_length=100, blank=True)
    object_id = models.CharField(max_length=100, blank=True)
    created = models.DateTimeField(null=True)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)
    payload = models.JSONField(help_text="safe fields only")
    result = models.CharField(
        max_length=16, choices=EventResult.choices, default=EventResult.PENDING
    )
    result_reason = models.CharField(max_length=200, blank=True)
    operation_id = models.CharField(max_length=40, blank=True)
    # From the object's metadata at ingestion (unverified until matched): lets a
    # purchase timeline show events that were quarantined before matching an operation.
    purchase_id = models.CharField(max_length=40, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Plain B-tree indexes declared here rather than `unique=True` / `db_index=True` on
        # the fields: on PostgreSQL those also build a `varchar_pattern_ops` twin for LIKE,
        # and nothing searches these ids by prefix. Every ingested event paid for four such
        # twins (10 index entries per insert instead of 6, half the events table's size).
        constraints = [
            # The dedupe of redeliveries: ingestion's INSERT … ON CONFLICT (event_id).
            models.UniqueConstraint(fields=["event_id"], name="providerevent_event_id_uniq"),
        ]
        indexes = [
            models.Index(fields=["object_id"], name="providerevent_object_idx"),
            models.Index(fields=["operation_id"], name="providerevent_operation_idx"),
            models.Index(fields=["purchase_id"], name="providerevent_purchase_idx"),
            models.Index(
                fields=["received_at"],
                condition=models.Q(result="quarantined"),
                name="providerevent_quarantine_idx",
            ),
            # The console's held-events queue (support.queues), oldest first: as small
            # as the queue, while applied events (most of the table) stay out of it.
            models.Index(
                fields=["received_at"],
                condition=models.Q(result="held"),
                name="providerevent_held_idx",
            ),
            # The events still waiting (the /metrics gauges and the retention job): exact
            # counts that read the waiting rows only, never the applied history.
            models.Index(
                fields=["result", "received_at"],
                condition=models.Q(result__in=["pending", "held", "quarantined"]),
                name="providerevent_waiting_idx",
            ),
        ]
