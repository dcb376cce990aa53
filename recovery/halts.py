"""Workflow halts: `checkout`, `refunds` and per-step `step:<name>`.

A halt is a row; `is_halted` below reads it on every use (recovery.selectors re-exports
it for the console). Setting or clearing one is a manual action: it writes its
AuditEntry in the same transaction.
"""

from __future__ import annotations

from typing import TypeVar

from django.db import connection, transaction
from django.db.models import Model, QuerySet
from django.utils import timezone

from audit.services import audit_write

from .models import OutboxCategory, OutboxMessage, StepName, StepRun, StepState, WorkflowHalt
from .outbox import outbox_put, run_steps_put

_M = TypeVar("_M", bound=Model)

WORKFLOW_HALTS = ("checkout", "refunds", "webhooks")  # webhooks: storefront deliveries wait
STEP_HALT_PREFIX = "step:"


class HaltError(ValueError):
    pass


def step_halt_name(step: str) -> str:
    return f"step:{step}"


def is_halted(name: str) -> bool:
    """`checkout`, `refunds` or `step:<name>`. Read on every call: halts must bite at once."""
    return WorkflowHalt.objects.filter(name=name).exists()


def is_halted_with(name: str, rows: QuerySet[_M]) -> tuple[bool, list[_M]]:
    """`is_halted(name)` and the model instances of `rows` (a plain query of one model, no
    joins), read in ONE statement: the same snapshot for both, so a caller that must see a
    halt committed while it waited for a lock reads them after the lock, as it would read
    the halt alone."""
    halt_sql, halt_params = (
        WorkflowHalt.objects.filter(name=name).values("pk").query.sql_with_params()
    )
    sql, params = rows.query.sql_with_params()
    found = list(
        rows.model._default_manager.raw(
            f"SELECT h.halt_found, r.* FROM (SELECT EXISTS({halt_sql}) AS halt_found) h "
            f"LEFT JOIN ({sql}) r ON TRUE",
            [*halt_params, *params],
        )
    )
    halted = bool(found[0].__dict__["halt_found"])
    return halted, [row for row in found if row.pk is not None]


def valid_halt_names() -> list[str]:
    return [*WORKFLOW_HALTS, *(f"{STEP_HALT_PREFIX}{s.value}" for s in StepName)]


def _validate(name: str, reason: str, actor: str) -> None:
    if name not in valid_halt_names():
        raise HaltError(f"unknown halt {name!r}; one of {', '.join(valid_halt_names())}")
    if not (reason or "").strip():
        raise HaltError("a reason is required")
    if not (actor or "").strip():
        raise HaltError("an actor is required")


def _audit(*, actor: str, action: str, name: str, reason: str, halted: bool) -> None:
    audit_write(
        actor=actor,
        action=action,
        target_type="workflow_halt",
        target_id=name,
        reason=reason,
        before={"halted": not halted},
        after={"halted": halted},
    )


def halt_set(*, name: str, reason: str, actor: str, audit: bool = True) -> WorkflowHalt:
    """Halt a workflow or step. Setting an existing halt again is a no-op (no new audit).

    `audit=False` is for a caller that writes its own (richer) AuditEntry in the same
    transaction — the console, which also records the request IP — so one action leaves
    one audit row."""
    _validate(name, reason, actor)
    with transaction.atomic():
        # INSERT ... ON CONFLICT DO NOTHING RETURNING: tells whether this call set it.
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {WorkflowHalt._meta.db_table} (name, reason, halted_by, created_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING id",
                [name, reason, actor, connection.ops.adapt_datetimefield_value(timezone.now())],
            )
            inserted = cursor.fetchone() is not None
        if inserted and audit:
            _audit(actor=actor, action="halt_set", name=name, reason=reason, halted=True)
        halt = WorkflowHalt.objects.get(name=name)
    return halt


def halt_clear(*, name: str, actor: str, reason: str, audit: bool = True) -> bool:
    """Clear a halt; returns False if it was not set. Resumes purchases waiting on a step.
    `audit` as for halt_set."""
    _validate(name, reason, actor)
    with transaction.atomic():
        deleted, _ = WorkflowHalt.objects.filter(name=name).delete()
        if not deleted:
            return False
        if audit:
            _audit(actor=actor, action="halt_clear", name=name, reason=reason, halted=False)
        if name.startswith(STEP_HALT_PREFIX):
            _resume_waiting_on_step(name[len(STEP_HALT_PREFIX) :])
        else:
            _resume_waiting_dispatches()
    return True


def _resume_waiting_dispatches() -> None:
    # Dispatches held by the halt back off in the outbox; make them due now so the queued
    # operations go out at once (a dispatch of a still-halted workflow just waits again).
    waiting = OutboxMessage.objects.filter(
        category=OutboxCategory.DISPATCH, processed_at__isnull=True, available_at__gt=timezone.now()
    )
    if waiting.update(available_at=timezone.now()):
        outbox_put(category=OutboxCategory.NOOP, payload={}, dedupe_key="halt-cleared-kick")


def _resume_waiting_on_step(step: str) -> None:
    # Purchases whose step is still pending get a RUN_STEPS message in this transaction;
    # the beat's stalled-fulfilment sweep would find them later anyway.
    if step not in [s.value for s in StepName]:
        return
    purchase_ids = StepRun.objects.filter(
        step=step, state__in=(StepState.PENDING, StepState.FAILED)
    ).values_list("purchase_id", flat=True)[:2000]
    for purchase_id in purchase_ids:
        run_steps_put(purchase_id=purchase_id)
