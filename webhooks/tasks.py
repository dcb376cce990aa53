"""Thin tasks: take ids, call one service."""
from celery import shared_task


@shared_task(name="webhooks.process_event", ignore_result=True, acks_late=True)
def process_event(event_id: int) -> str:
    """Direct use only: the normal path is the outbox relay (category PROCESS_EVENT),
    which calls the same service. The service is idempotent, so both may run."""
    from webhooks.services import event_process

    return event_process(event_id=event_id)
