"""Delete finished Idempotency-Key records older than a retention period.

A replay answers from a record "for as long as the record exists"
(docs/walkthrough.md#api-rules-the-code-relies-on); this
command sets how long that is. In-flight records are never touched: their lease decides.
"""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from payments.models import IdempotencyRecord


class Command(BaseCommand):
    help = "Delete finished idempotency records older than --days (default 30)."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=30)

    def handle(self, *args, days, **options):
        cutoff = timezone.now() - timedelta(days=days)
        deleted, _ = IdempotencyRecord.objects.filter(
            state=IdempotencyRecord.State.DONE, created_at__lt=cutoff
        ).delete()
        self.stdout.write(
            f"deleted {deleted} idempotency record(s) finished before {cutoff:%Y-%m-%d}"
        )
