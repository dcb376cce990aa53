"""The one permission module: every console view and action asks here.

Roles are Django groups. The matrix below is the whole policy; tests check it as a
matrix (every action x role).
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import models


class Role(models.TextChoices):
    SUPPORT = "support"
    OPERATOR = "operator"
    FINANCE = "finance"


class Action(models.TextChoices):
    VIEW = "view"  # queues, timelines, safe fields, search
    ADD_NOTE = "add_note"
    RECONCILE = "reconcile"  # on-demand read-back (read-only at the provider)
    REQUEST_REFUND = "request_refund"
    RESOLVE = "resolve"  # manual resolution of an unknown operation
    REPLAY = "replay"
    HALT = "halt"  # pause/resume workflows
    TRIAGE_QUARANTINE = "triage_quarantine"
    VIEW_REDACTED_PAYLOAD = "view_redacted_payload"
    MANAGE_INCIDENTS = "manage_incidents"
    APPROVE_REFUND = "approve_refund"
    VIEW_SETTLEMENT = "view_settlement"
    REVIEW_EXTERNAL = "review_external"  # an operation made outside Verity
    SETTLE_DISCREPANCY = "settle_discrepancy"  # explain and close a settlement row
    RETRY_OUTBOX = "retry_outbox"  # make a backed-off outbox row due now
    DECIDE_STEP = "decide_step"  # complete a compensation-queue step forward / mark handled
    MANAGE_WEBHOOKS = "manage_webhooks"  # enable/disable a storefront's endpoint, resend


_SUPPORT = {Action.VIEW, Action.ADD_NOTE, Action.RECONCILE, Action.REQUEST_REFUND}
_OPERATOR = _SUPPORT | {
    Action.RESOLVE,
    Action.REPLAY,
    Action.HALT,
    Action.TRIAGE_QUARANTINE,
    Action.VIEW_REDACTED_PAYLOAD,
    Action.MANAGE_INCIDENTS,
    Action.RETRY_OUTBOX,
    Action.DECIDE_STEP,
    Action.MANAGE_WEBHOOKS,
}
_FINANCE = _SUPPORT | {
    Action.APPROVE_REFUND,
    Action.VIEW_SETTLEMENT,
    Action.SETTLE_DISCREPANCY,
    Action.REVIEW_EXTERNAL,
}

MATRIX: dict[Role, frozenset[Action]] = {
    Role.SUPPORT: frozenset(_SUPPORT),
    Role.OPERATOR: frozenset(_OPERATOR),
    Role.FINANCE: frozenset(_FINANCE),
}


def roles_of(user) -> set[Role]:
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return set()
    # Cached on the user object, which lives for one request: a console page asks `can()`
    # a dozen times and must not query the groups each time.
    cached = getattr(user, "_verity_roles", None)
    if cached is None:
        names = set(user.groups.values_list("name", flat=True))
        cached = frozenset(r for r in Role if r.value in names)
        user._verity_roles = cached
    return set(cached)


def roles_with(action: Action) -> list[Role]:
    """The roles that hold `action` (for "ask someone with the … role")."""
    return [role for role, actions in MATRIX.items() if action in actions]


def can(user, action: Action) -> bool:
    return any(action in MATRIX[r] for r in roles_of(user))


def require(user, action: Action) -> None:
    if not can(user, action):
        raise PermissionDenied(f"role lacks permission: {action}")


def ensure_groups() -> None:
    from django.contrib.auth.models import Group

    for role in Role:
        Group.objects.get_or_create(name=role.value)
