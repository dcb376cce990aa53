"""Bringing the outbox to rest before a test asserts or its database is flushed."""

from __future__ import annotations


def settle_outbox(timeout: float = 15.0) -> None:
    """Let follow-up work a test committed finish before the database is flushed.

    A payment writes outbox rows and kicks the relay on commit; the session's Celery worker
    (if a test started it) may be handling them when pytest-django truncates the tables,
    and TRUNCATE against a worker's row locks deadlocks — leaving data behind for every
    later test. So: drain what is due here (the relay's claims are SKIP LOCKED, safe next
    to the worker) until nothing is due or being handled.
    """
    import time

    from django.db import connection
    from django.db.models import Q
    from django.utils import timezone

    if connection.in_atomic_block:
        return  # a rolled-back test: nothing was committed, nothing was kicked
    from recovery.models import OutboxMessage
    from recovery.relay import relay_drain_once

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        relay_drain_once()
        now = timezone.now()
        busy = OutboxMessage.objects.filter(processed_at__isnull=True).filter(
            Q(available_at__lte=now) | Q(claimed_until__gt=now)
        )
        if not busy.exists():
            return
        time.sleep(0.05)


def wait_outbox_idle(timeout: float = 30.0) -> None:
    """Wait until no due message is unprocessed or claimed: a worker still writing while
    the test database is flushed deadlocks the TRUNCATE."""
    from django.utils import timezone

    from recovery.models import OutboxMessage
    from tests.waiting import wait_for

    wait_for(
        lambda: (
            not OutboxMessage.objects.filter(
                processed_at__isnull=True, available_at__lte=timezone.now(), attempts__lt=3
            ).exists()
        ),
        timeout=timeout,
    )


def settle(timeout: float = 30.0) -> None:
    """Bring the outbox to rest: drain what is due here, and wait for messages another
    worker (the session `celery_worker`, if one is running) has claimed to finish.

    Tests assert final states after settle(): whichever process handled a message, the
    result must be the same — that is the point of the outbox.
    """
    import time

    from django.db.models import Q
    from django.utils import timezone

    from recovery.models import OutboxMessage
    from recovery.relay import relay_drain_once

    deadline = time.monotonic() + timeout
    while True:
        while relay_drain_once():
            pass
        now = timezone.now()
        busy = (
            OutboxMessage.objects.filter(processed_at__isnull=True)
            .filter(Q(available_at__lte=now, attempts__lt=5) | Q(claimed_until__gt=now))
            .exists()
        )
        if not busy:
            return
        if time.monotonic() > deadline:
            raise AssertionError("outbox did not come to rest")
        time.sleep(0.05)
