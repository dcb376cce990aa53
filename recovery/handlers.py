"""The outbox categories recovery owns (registered from RecoveryConfig.ready())."""

from __future__ import annotations

from typing import Any

from .disputes import dispute_changed
from .models import OutboxCategory
from .orchestrator import customer_email_send, operation_settled, purchase_fulfil
from .outbox import outbox_handler


@outbox_handler(OutboxCategory.OPERATION_SETTLED)
def _handle_operation_settled(payload: dict[str, Any]) -> None:
    operation_settled(operation_id=payload["operation"])


@outbox_handler(OutboxCategory.RUN_STEPS)
def _handle_run_steps(payload: dict[str, Any]) -> None:
    purchase_fulfil(purchase_id=payload["purchase"])


@outbox_handler(OutboxCategory.DISPUTE_CHANGED)
def _handle_dispute_changed(payload: dict[str, Any]) -> None:
    dispute_changed(dispute_id=payload["dispute"])


@outbox_handler(OutboxCategory.CUSTOMER_EMAIL)
def _handle_customer_email(payload: dict[str, Any]) -> None:
    customer_email_send(email_id=payload["email"])


@outbox_handler(OutboxCategory.NOOP)
def _handle_noop(payload: dict[str, Any]) -> None:
    return None
