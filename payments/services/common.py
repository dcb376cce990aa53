"""Shared by the services modules: the audit trail of transitions (history), the
transition helpers, workflow halts as they bind a dispatch, and small reads of a
purchase's money that several steps need.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.utils import timezone

from audit.services import audit_write
from recovery.halts import is_halted
from recovery.models import OutboxCategory
from recovery.outbox import outbox_put

from ..enums import TERMINAL_OUTCOMES, Grade, OperationKind, Outcome
from ..errors import DomainError
from ..locks import lock_purchase_and_operation
from ..models import OperationTransition, PaymentOperation, ProviderCall, Purchase
from ..providers.base import CallResult
from ..providers.stripe import get_provider


log = logging.getLogger("verity.payments")


def _halted(name: str) -> bool:
    return is_halted(name)


# The workflow whose halt binds each kind of dispatch (DESIGN §5.9): money in, or money
# back out (voids, refunds and compensations obey `refunds`).
_WORKFLOW_OF_KIND = {OperationKind.CHARGE: "checkout", OperationKind.AUTHORIZE: "checkout",
                     OperationKind.CAPTURE: "checkout", OperationKind.VOID: "refunds",
                     OperationKind.REFUND: "refunds"}


def operation_workflow(kind: str) -> str:
    return _WORKFLOW_OF_KIND[OperationKind(kind)]


_HISTORY_BATCH = threading.local()


@contextmanager
def history_batch() -> Iterator[None]:
    """Inside the caller's transaction: history rows written by `_history` are collected
    and inserted in one statement when the block ends (discarded if it raises, as the
    transaction is). For a set-based apply (the reconcile sweep) whose steps never read
    back the history rows they write in the same block."""
    if getattr(_HISTORY_BATCH, "rows", None) is not None:
        yield  # already collecting: the outer block inserts
        return
    _HISTORY_BATCH.rows = []
    try:
        yield
        rows = _HISTORY_BATCH.rows
        _HISTORY_BATCH.rows = None
        if rows:
            OperationTransition.objects.bulk_create(rows)
    finally:
        _HISTORY_BATCH.rows = None


def _history(*, purchase_id: str, operation: PaymentOperation | None, field: str, source: str,
             target: str, cause: str, evidence: dict | None = None, actor: str = "") -> None:
    row = OperationTransition(
        purchase_id=purchase_id, operation=operation, field=field, source=source,
        target=target, cause=cause, evidence=evidence or {}, actor=actor)
    batch = getattr(_HISTORY_BATCH, "rows", None)
    if batch is not None:
        batch.append(row)
        return
    row.save(force_insert=True)


def _purchase_to(purchase: Purchase, name: str, *, cause: str, actor: str = "",
                 evidence: dict | None = None) -> bool:
    """Apply a purchase FSM transition if allowed; record it. Caller holds the lock."""
    method = getattr(purchase, name)
    from django_fsm import can_proceed

    if not can_proceed(method):
        return False
    source = purchase.status
    method()
    if purchase.status == source:
        return False
    purchase.save(update_fields=purchase.status_change_fields())
    _history(purchase_id=purchase.id, operation=None, field="status", source=source,
             target=purchase.status, cause=cause, evidence=evidence, actor=actor)
    return True


def _op_to(op: PaymentOperation, name: str, *, cause: str, actor: str = "",
           evidence: dict | None = None, fields: tuple = ()) -> None:
    source = op.outcome
    getattr(op, name)()
    op.save(update_fields=["outcome", "stage", "updated_at", *fields])
    _history(purchase_id=op.purchase_id, operation=op, field="outcome", source=source,
             target=op.outcome, cause=cause, evidence=evidence, actor=actor)


def _dispatch_backstop(op: PaymentOperation) -> None:
    """The caller dispatches right after commit; if its process dies first, this delayed
    outbox message sends the queued operation anyway (a second dispatch is a no-op), so a
    `pending` operation never holds its purchase's slot forever."""
    outbox_put(category=OutboxCategory.DISPATCH, payload={"operation": op.id},
               dedupe_key=f"dispatch-backstop:{op.id}",  # never absorbs a prompt dispatch
               delay_seconds=settings.IDEMPOTENCY_LEASE_SECONDS + 5)


def payment_unsettled(payment: PaymentOperation) -> bool:
    """Verity's own record of a payment is not settled yet: no terminal outcome, or a
    person's "failed" still awaiting the provider's read-back (it may be overturned)."""
    return payment.outcome not in TERMINAL_OUTCOMES or (
        payment.outcome == Outcome.FAILED and payment.grade == Grade.ACKNOWLEDGED)


def _captured_amount(purchase: Purchase) -> int:
    """What the purchase's own payment captured (a duplicate and its return excluded)."""
    total = 0
    for op in (purchase.operations.filter(outcome=Outcome.SUCCEEDED, is_duplicate=False)
               .exclude(parent__is_duplicate=True)):
        if op.kind == OperationKind.CHARGE or op.kind == OperationKind.CAPTURE:
            total += op.amount
    return total


def _purchase_refunds(purchase: Purchase):
    """Refunds of the purchase's own payment (not the compensation of a duplicate)."""
    return purchase.operations.filter(kind=OperationKind.REFUND).exclude(
        parent__is_duplicate=True)


def _actor(api_client, acting_user) -> str:
    if acting_user is not None:
        return acting_user.get_username()
    return api_client.name if api_client is not None else "system"


def _lock_or_404(operation_id: str) -> tuple[Purchase, PaymentOperation]:
    try:
        return lock_purchase_and_operation(operation_id)
    except PaymentOperation.DoesNotExist:
        raise DomainError("not_found", "No such operation.", status=404) from None


def _audit(*, actor: str, action: str, op: PaymentOperation, reason: str,
           detail: dict | None = None) -> None:
    audit_write(actor=actor, action=action, target_type="operation",
                target_id=op.id, purchase_id=op.purchase_id, reason=reason,
                detail=detail or {})


def _provider():
    return get_provider()


def _record_call(call: ProviderCall, result: CallResult) -> None:
    ProviderCall.objects.filter(id=call.id).update(
        http_status=result.http_status, classification=result.classification,
        request_id=result.request_id[:100], error_code=result.error_code[:64],
        fault_drill=result.fault_drill, finished_at=timezone.now(),
        safe_fields=result.object.safe_fields() if result.object else {"detail": result.detail})
