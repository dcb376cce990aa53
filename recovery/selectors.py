"""Recovery reads: halts, step states, console queues, metric inputs.

Reads only; writes live in recovery.services / orchestrator / relay. Payments rows are
read here (never written): recovery decides *what* follow-up is due, payments.services
performs it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, Manager, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, Purchase
from payments.selectors import purchase_money

from .halts import is_halted, step_halt_name  # noqa: F401  (re-exported: the console reads them here)
from .models import (
    Order,
    OutboxMessage,
    RecoveryDecision,
    SettlementDiscrepancy,
    StepName,
    StepRun,
    StepState,
    WorkflowHalt,
)
from .reads import steps_for_purchase  # noqa: F401  (re-exported)

# Outcomes that still wait for evidence (reconcile targets).
_OPEN_OUTCOMES = (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER)


def halts_list() -> QuerySet[WorkflowHalt]:
    return WorkflowHalt.objects.order_by("name")


def step_runs_for_purchase(purchase_id: str) -> QuerySet[StepRun]:
    return StepRun.objects.filter(purchase_id=purchase_id).order_by("created_at", "id")


def deliverable_for(purchase_id: str) -> dict[str, Any] | None:
    """The stored deliverable result while its redelivery period lasts and the purchase
    keeps its money, else None: a purchase refunded in full, voided or whose dispute was
    lost serves nothing (docs/reliability.md#rules-every-money-movement-obeys; its unwind also
    ends the period)."""
    if purchase_money(purchase_id).returned:
        return None
    run = StepRun.objects.filter(
        purchase_id=purchase_id, step=StepName.DELIVERABLE, state=StepState.DONE
    ).first()
    if run is None:
        return None
    if run.result_expires_at and run.result_expires_at < timezone.now():
        return None
    return {
        "job_reference": run.external_reference,
        "result": run.result,
        "expires_at": run.result_expires_at,
    }


def order_for(purchase_id: str) -> Order | None:
    return Order.objects.filter(purchase_id=purchase_id).first()


def decisions_for(purchase_id: str) -> QuerySet[RecoveryDecision]:
    return RecoveryDecision.objects.filter(purchase_id=purchase_id).order_by("created_at", "id")


# -- console queues -----------------------------------------------------------------


def _operations() -> Manager[PaymentOperation]:
    return PaymentOperation.objects


def queue_unknown_operations(limit: int = 200) -> QuerySet[PaymentOperation]:
    """Operations waiting for evidence, oldest first (unknown by age)."""
    return (
        _operations()
        .filter(outcome__in=_OPEN_OUTCOMES)
        .select_related("purchase")
        .order_by("created_at")[:limit]
    )


def queue_escalated(limit: int = 200) -> QuerySet[PaymentOperation]:
    return (
        _operations()
        .filter(escalated_at__isnull=False, outcome__in=_OPEN_OUTCOMES)
        .select_related("purchase")
        .order_by("escalated_at")[:limit]
    )


def paid_without_order(
    *, older_than_seconds: float | None = None, limit: int | None = 500
) -> QuerySet[Purchase]:
    """Purchases the provider says are paid whose order row does not exist yet."""

    if older_than_seconds is None:
        older_than_seconds = settings.PAID_WITHOUT_ORDER_SECONDS
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    return (
        Purchase.objects.filter(
            status__in=(PurchaseStatus.PAID, PurchaseStatus.FULFILLING), updated_at__lte=cutoff
        )
        .exclude(Exists(Order.objects.filter(purchase_id=OuterRef("id"))))
        .order_by("updated_at")[:limit]
    )


def stalled_fulfilment(
    *, older_than_seconds: float | None = None, limit: int = 500
) -> QuerySet[Purchase]:
    """Paid/fulfilling purchases not touched for a while (any incomplete step), and won
    disputes whose fulfilment the dispute paused (a step not done, or none ever run): the
    status stays `dispute_won` after its steps finish, so only unfinished ones count."""

    if older_than_seconds is None:
        older_than_seconds = settings.PAID_WITHOUT_ORDER_SECONDS
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    runs = StepRun.objects.filter(purchase_id=OuterRef("id"))
    paused_by_dispute = Q(status=PurchaseStatus.DISPUTE_WON) & (
        Exists(runs.exclude(state__in=(StepState.DONE, StepState.COMPENSATED))) | ~Exists(runs)
    )
    return Purchase.objects.filter(
        Q(status__in=(PurchaseStatus.PAID, PurchaseStatus.FULFILLING)) | paused_by_dispute,
        updated_at__lte=cutoff,
    ).order_by("updated_at")[:limit]


def _compensation_needed_qs() -> QuerySet[StepRun]:
    # A compensated step whose compensation operation has not succeeded at the provider
    # still needs attention (reversed only once the provider confirms:
    # docs/reliability.md#rules-every-money-movement-obeys).
    compensation_pending = Q(state=StepState.COMPENSATED) & ~Exists(
        PaymentOperation.objects.filter(
            id=OuterRef("compensation_operation_id"), outcome=Outcome.SUCCEEDED
        )
    )
    return StepRun.objects.filter(
        Q(state__in=(StepState.MANUAL, StepState.UNKNOWN)) | compensation_pending
    )


def queue_compensation_needed(limit: int = 200) -> QuerySet[StepRun]:
    """Steps that could not complete and are not (yet) made good: manual/unknown steps
    waiting for a person, and compensations not yet confirmed by the provider."""
    return _compensation_needed_qs().order_by("created_at")[:limit]


def compensation_needed_count() -> int:
    return _compensation_needed_qs().count()


def queue_stuck_outbox(
    *, min_attempts: int | None = None, older_than_seconds: float | None = None, limit: int = 200
) -> QuerySet[OutboxMessage]:
    if min_attempts is None:
        min_attempts = settings.OUTBOX_STUCK_ATTEMPTS
    if older_than_seconds is None:
        older_than_seconds = settings.OUTBOX_STUCK_SECONDS
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    return (
        OutboxMessage.objects.filter(processed_at__isnull=True)
        .filter(Q(attempts__gte=min_attempts) | Q(created_at__lte=cutoff))
        .order_by("created_at")[:limit]
    )


def queue_settlement_discrepancies(
    *, include_resolved: bool = False, limit: int = 200
) -> QuerySet[SettlementDiscrepancy]:
    qs = SettlementDiscrepancy.objects.all()
    if not include_resolved:
        qs = qs.filter(resolved_at__isnull=True)
    return qs.order_by("-created_at")[:limit]


# -- metric inputs ------------------------------------------------------------------


def unknown_operations_stats() -> tuple[int, float]:
    """(count, oldest age in seconds) of operations whose outcome is unknown."""
    agg = _operations().filter(outcome=Outcome.UNKNOWN).aggregate(oldest=Min("created_at"))
    count = _operations().filter(outcome=Outcome.UNKNOWN).count()
    oldest = agg["oldest"]
    age = (timezone.now() - oldest).total_seconds() if oldest else 0.0
    return count, age


def outbox_backlog() -> int:
    return OutboxMessage.objects.filter(processed_at__isnull=True).count()
