"""Console reads for money the provider moved on its own: the disputes queue (finance,
nearest evidence deadline first) and the "made outside Verity" queue (external linked
operations waiting for a person to review them).

Kept out of support/selectors.py so those queues stay small, self-contained additions;
support.selectors delegates the two queue names here. Imports no other support module
(support.selectors imports this one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Min
from django.utils import timezone

from payments.enums import DISPUTE_CLOSED_STATUSES, Origin
from payments.models import Dispute, PaymentOperation
from payments.money import format_money

QUEUE_TEMPLATES = {
    "disputes": "console/queue_disputes.html",
    "external": "console/queue_external.html",
}
DUE_SOON = timedelta(hours=48)


@dataclass(frozen=True)
class ProviderQueueItem:
    """The fields of support.selectors.QueueItem, plus what these two pages show."""

    since: datetime
    kind: str
    ref: str
    purchase_id: str
    summary: str
    owner: str = ""
    runbook: str = ""
    due: datetime | None = None
    status: str = ""
    review: bool = False
    customer_email: str = ""  # filled by support.queues for every queue's rows

    @property
    def age(self) -> timedelta:
        return timezone.now() - self.since

    @property
    def due_soon(self) -> bool:
        return self.due is not None and self.due - timezone.now() <= DUE_SOON


def open_disputes():
    return Dispute.objects.exclude(status__in=DISPUTE_CLOSED_STATUSES)


def disputes_due_within(window: timedelta = DUE_SOON) -> int:
    """Open disputes whose evidence deadline is within `window` (or already past)."""
    return open_disputes().filter(evidence_due_by__lte=timezone.now() + window).count()


def unreviewed_external_operations():
    return PaymentOperation.objects.filter(origin=Origin.PROVIDER, reviewed_at__isnull=True)


def queue_items(name: str, *, limit: int) -> list[ProviderQueueItem]:
    if name == "disputes":
        rows = open_disputes().order_by("evidence_due_by", "opened_at")[:limit]
        return [
            ProviderQueueItem(
                d.opened_at,
                "dispute",
                d.id,
                d.purchase_id,
                f"{format_money(d.amount, d.currency)} · {d.reason or 'no reason given'} · "
                f"withdrawn {format_money(d.funds_withdrawn, d.currency)}, fees "
                f"{format_money(d.fees, d.currency)}",
                "finance",
                due=d.evidence_due_by,
                status=d.status,
            )
            for d in rows
        ]
    if name == "external":
        rows = unreviewed_external_operations().order_by("created_at")[:limit]
        return [
            ProviderQueueItem(
                op.created_at,
                "operation",
                op.id,
                op.purchase_id,
                f"{op.kind} {format_money(op.amount, op.currency)} made outside Verity · "
                f"{op.provider_reference} · evidence {op.verification}",
                "finance",
                status=op.outcome,
                review=True,
            )
            for op in rows
        ]
    raise KeyError(name)


def count_oldest(name: str) -> tuple[int, datetime | None]:
    if name == "disputes":
        r = open_disputes().aggregate(n=Count("pk"), oldest=Min("opened_at"))
    elif name == "external":
        r = unreviewed_external_operations().aggregate(n=Count("pk"), oldest=Min("created_at"))
    else:
        raise KeyError(name)
    return r["n"], r["oldest"]
