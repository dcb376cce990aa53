"""Recovery writes other apps may call (the console, management commands, the core).

The implementations live next to their machinery; this module is the public surface.
"""
from .halts import HaltError, halt_clear, halt_set, valid_halt_names  # noqa: F401
from .orchestrator import purchase_fulfil, step_resolve  # noqa: F401
from .outbox import outbox_put  # noqa: F401
from .reconciler import (  # noqa: F401
    expire_stale_purchases,
    reconcile_due,
    resume_stalled_fulfilment,
    sweep_dead_dispatches,
)
from .relay import relay_drain, relay_drain_once  # noqa: F401
from .settlement import settlement_compare  # noqa: F401


def discrepancy_resolve(*, discrepancy_id: int, actor: str, reason: str) -> None:
    """Finance closes a settlement discrepancy; audit row in the same transaction."""
    from django.db import transaction
    from django.utils import timezone

    from support.models import AuditEntry

    from .models import SettlementDiscrepancy

    if not (reason or "").strip() or not (actor or "").strip():
        raise ValueError("actor and reason are required")
    with transaction.atomic():
        row = SettlementDiscrepancy.objects.select_for_update().get(id=discrepancy_id)
        if row.resolved_at is not None:
            return
        row.resolved_at = timezone.now()
        row.save(update_fields=["resolved_at"])
        AuditEntry.objects.create(actor=actor, action="discrepancy_resolve",
                                  target_type="settlement_discrepancy", target_id=str(row.id),
                                  reason=reason, detail={"reference": row.provider_reference,
                                                         "kind": row.kind})
