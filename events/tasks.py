"""Tasks are an API: thin, named, idempotent."""

from celery import shared_task


@shared_task(name="events.deliver_due", ignore_result=True)
def deliver_due() -> int:
    from .delivery import deliveries_send_all_due

    return deliveries_send_all_due()


@shared_task(name="events.prune", ignore_result=True)
def prune() -> int:
    from .services import events_prune

    return events_prune()
