"""Writing to the transactional outbox (the relay lives in recovery.relay)."""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from .models import OutboxCategory, OutboxMessage


def outbox_put(*, category: OutboxCategory, payload: dict, dedupe_key: str,
               delay_seconds: float = 0) -> None:
    """Write a message in the caller's transaction; kick the relay after commit.

    INSERT ... ON CONFLICT DO NOTHING against the partial unique index on unprocessed
    dedupe keys: a duplicate while one is pending is absorbed, never an error.
    """
    assert transaction.get_connection().in_atomic_block, "outbox_put needs the caller's atomic()"
    from .relay import relay_flush_pending

    relay_flush_pending()  # a relay batch's handled messages are marked first (issue 18)
    OutboxMessage.objects.bulk_create(
        [OutboxMessage(category=category, payload=payload, dedupe_key=dedupe_key,
                       available_at=timezone.now() + timedelta(seconds=delay_seconds))],
        ignore_conflicts=True,
    )
    if delay_seconds <= 0:
        transaction.on_commit(_kick_relay, robust=True)


def _kick_relay() -> None:
    from recovery.tasks import relay_drain

    # retry=False: with the broker down, fail at once instead of holding the committed
    # request for Celery's publish retries (measured ~3 s per kick). The row is already
    # committed; the beat's sweep re-kicks the relay when the broker is back.
    # Coalesced (recovery.kick): at most two publishes per short window, not one per row.
    from .kick import relay_kick_coalesced

    relay_kick_coalesced(lambda countdown: relay_drain.apply_async(retry=False,
                                                                   countdown=countdown))
