"""Recovery writes other apps may call (the console, management commands, the core).

The implementations live next to their machinery; this module is the public surface.
"""

from django.db import transaction
from django.utils import timezone

from audit.services import audit_write

from .halts import HaltError, halt_clear, halt_set, valid_halt_names  # noqa: F401
from .models import OutboxMessage, SettlementDiscrepancy
from .orchestrator import purchase_fulfil as purchase_fulfil
from .orchestrator import step_resolve as step_resolve
from .outbox import outbox_put, relay_kick  # noqa: F401
from .reconciler import (  # noqa: F401
    expire_stale_purchases,
    reconcile_due,
    resume_stalled_fulfilment,
    sweep_dead_dispatches,
)
from .relay import relay_drain, relay_drain_once  # noqa: F401
from .settlement import settlement_compare  # noqa: F401


def discrepancy_resolve(
    *, discrepancy_id: int, actor: str, reason: str, ip: str | None = None
) -> bool:
    """Finance closes a settlement discrepancy with its explanation; one audit row in the
    same transaction. False (and no row) if it was already closed."""

    if not (reason or "").strip() or not (actor or "").strip():
        raise ValueError("actor and reason are required")
    with transaction.atomic():
        row = SettlementDiscrepancy.objects.select_for_update().get(id=discrepancy_id)
        if row.resolved_at is not None:
            return False
        row.resolved_at = timezone.now()
        row.save(update_fields=["resolved_at"])
        audit_write(
            actor=actor,
            action="discrepancy_resolve",
            target_type="settlement_discrepancy",
            target_id=str(row.id),
            reason=reason,
            ip=ip or None,
            before={"open": True},
            after={"open": False},
            detail={"reference": row.provider_reference, "kind": row.kind},
        )
    return True


class OutboxRetryRefused(ValueError):
    pass


def outbox_retry_now(
    *, message_id: int, actor: str, reason: str, ip: str | None = None
) -> OutboxMessage:
    """A person makes a backed-off outbox row due now (after fixing its cause). The relay
    runs it as usual: claim, handler outside the transaction, backoff if it fails again.
    A row a worker holds right now, or one already processed, is refused."""

    if not (reason or "").strip() or not (actor or "").strip():
        raise ValueError("actor and reason are required")
    with transaction.atomic():
        row = OutboxMessage.objects.select_for_update().filter(id=message_id).first()
        if row is None:
            raise OutboxRetryRefused("No such outbox message.")
        if row.processed_at is not None:
            raise OutboxRetryRefused("This message was processed meanwhile; nothing to retry.")
        now = timezone.now()
        if row.claimed_until is not None and row.claimed_until > now:
            raise OutboxRetryRefused("A worker is running this message right now.")
        before = {"available_at": row.available_at.isoformat(), "attempts": row.attempts}
        row.available_at = now
        row.save(update_fields=["available_at"])
        audit_write(
            actor=actor,
            action="outbox_retry_now",
            target_type="outbox_message",
            target_id=str(row.id),
            purchase_id=str((row.payload or {}).get("purchase", ""))[:40]
            if isinstance(row.payload, dict)
            else "",
            reason=reason,
            ip=ip or None,
            before=before,
            after={"available_at": now.isoformat(), "attempts": row.attempts},
            detail={"category": row.category, "last_error": row.last_error[:300]},
        )
        relay_kick()
    return row
