"""Beat jobs that find work nobody announced: due reconciliations, dead dispatches,
paid purchases whose fulfilment stalled, stale purchases.

Each job only *finds* work and writes outbox messages (or calls one payments service);
the relay does the work. Reconciliation itself is payments.services.operation_reconcile:
read-only at the provider, backoff schedule RECONCILE_SCHEDULE_SECONDS, escalation to the
purchase's recovery_owner after RECONCILE_DEADLINE_SECONDS.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from payments.enums import Grade
from payments.models import PaymentOperation
from payments.services import operations_sweep_dead_dispatches, purchases_expire_stale

from .orchestrator import run_steps_message_put
from .outbox import reconcile_put
from .selectors import stalled_fulfilment

log = logging.getLogger(__name__)

_OPEN_OUTCOMES = ("unknown", "awaiting_provider", "awaiting_buyer")


def reconcile_due(*, limit: int = 500) -> int:
    """Put a RECONCILE message for every open operation whose next read-back is due.

    The core schedules the next read-back itself (a delayed outbox row), but a message
    being handled absorbs a re-put with the same dedupe key; this sweep is what makes the
    schedule hold whatever happened to those rows.
    """
    # Open operations, and outcomes only a person gave (acknowledged): those are read back
    # until the provider confirms or overturns them.
    due = list(
        PaymentOperation.objects.filter(
            Q(outcome__in=_OPEN_OUTCOMES) | Q(grade=Grade.ACKNOWLEDGED),
            next_reconcile_at__lte=timezone.now(),
        )
        .order_by("next_reconcile_at")
        .values_list("id", flat=True)[:limit]
    )
    with transaction.atomic():
        for op_id in due:
            # A pending row written earlier with a delay absorbed that put: it is due now.
            # Rows that already failed keep their own backoff.
            reconcile_put(operation_id=op_id, due_now=True)
    return len(due)


def sweep_dead_dispatches() -> int:
    """Dispatches past their lease with no outcome: the core turns them unknown (or
    failed `not_confirmed` when confirm was never claimed) — never re-dispatched. A live
    worker renews its lease while it waits (an x402 refund queued for the signer's lock),
    and one swept anyway sends nothing more (its send is fenced on `dispatching`)."""

    return operations_sweep_dead_dispatches()


def resume_stalled_fulfilment(*, older_than_seconds: float | None = None) -> int:
    """Paid-without-order and any paid/fulfilling purchase left alone for a while get a
    RUN_STEPS message (the orchestrator resumes from the first incomplete step)."""
    ids = list(
        stalled_fulfilment(older_than_seconds=older_than_seconds).values_list("id", flat=True)
    )
    with transaction.atomic():
        for purchase_id in ids:
            run_steps_message_put(purchase_id)
    if ids:
        log.info("resumed stalled fulfilment for %d purchases", len(ids))
    return len(ids)


def expire_stale_purchases() -> int:
    return purchases_expire_stale()
