"""The outbox categories the payments core owns (registered from PaymentsConfig.ready())."""

from __future__ import annotations

from recovery.models import OutboxCategory
from recovery.outbox import outbox_handler

from .services import operation_dispatch_or_wait, operation_reconcile
from .services.cancels import payment_cancel_after_failure
from .services.external import ExternalResult, external_refunds_read


@outbox_handler(OutboxCategory.RECONCILE)
def _handle_reconcile(payload: dict) -> None:
    operation_reconcile(operation_id=payload["operation"], actor="reconciler")


@outbox_handler(OutboxCategory.DISPATCH)
def _handle_dispatch(payload: dict) -> None:
    # Still queued after the call = its workflow is halted: back off, do not drop it.
    operation_dispatch_or_wait(operation_id=payload["operation"])


@outbox_handler(OutboxCategory.PAYMENT_CANCEL)
def _handle_payment_cancel(payload: dict) -> None:
    payment_cancel_after_failure(operation_id=payload["operation"])


class ExternalRefundsWait(Exception):
    """An external refund read back before Verity's own record of the payment settled: the
    message backs off and reads again (the refund is real; it must not be dropped)."""


@outbox_handler(OutboxCategory.PROVIDER_REFUNDS_READ)
def _handle_provider_refunds_read(payload: dict) -> None:
    results = external_refunds_read(payment_operation_id=payload["operation"])
    waiting = [r.reason for r in results if r.result == ExternalResult.NOT_EXTERNAL]
    if waiting:
        raise ExternalRefundsWait(f"external refunds wait: {', '.join(waiting)}")
