"""The outbox category webhooks owns (registered from WebhooksConfig.ready())."""

from __future__ import annotations

from recovery.models import OutboxCategory
from recovery.outbox import outbox_handler

from .services import event_process


@outbox_handler(OutboxCategory.PROCESS_EVENT)
def _handle_process_event(payload: dict) -> None:
    event_process(event_id=payload["event"])
