"""Tasks are an API: thin, named, idempotent."""

from celery import shared_task


@shared_task(name="events.deliver_due", ignore_result=True)
def deliver_due() -> int:
    from .delivery import deliveries_send_run, next_retry_in

    sent, capped = deliveries_send_run()
    if capped:
        # Stopped at its cap with more perhaps due: its kicks are coalesced (one run per
        # window stands for many commits), so it runs on at once rather than a sweep later.
        deliver_due.apply_async()
        return sent
    # A retry due before the beat's next sweep is sent when it is due, not up to a sweep
    # late (and without a beat at all, as under tests): one delayed run, claims are leased.
    wait = next_retry_in()
    if wait is not None:
        deliver_due.apply_async(countdown=wait)
    return sent


@shared_task(name="events.prune", ignore_result=True)
def prune() -> int:
    from .services import events_prune

    return events_prune()
