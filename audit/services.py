"""The one way to write an audit row (Zulip's `do_*` pattern: the action and its audit row
commit together, so there is no action without its row and no row without its action)."""

from __future__ import annotations

from django.db import transaction

from .models import AuditEntry


def audit_write(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    reason: str,
    purchase_id: str = "",
    before: dict | None = None,
    after: dict | None = None,
    detail: dict | None = None,
    ip: str | None = None,
) -> AuditEntry:
    """Append one audit row inside the caller's transaction (asserted: a row written in its
    own transaction could commit while the change it records rolls back)."""
    assert transaction.get_connection().in_atomic_block, "audit_write needs the caller's atomic()"
    return AuditEntry.objects.create(
        actor=str(actor)[:150],
        action=action,
        target_type=target_type,
        target_id=str(target_id)[:64],
        purchase_id=purchase_id or "",
        reason=reason,
        ip=ip or None,
        before=before or {},
        after=after or {},
        detail=detail or {},
    )
