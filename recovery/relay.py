"""Outbox relay: claim due rows with FOR UPDATE SKIP LOCKED, handle outside the claim.

Shape (after sentry's hybridcloud outbox):
  1. a short transaction claims up to `batch` due rows — SKIP LOCKED so concurrent
     drainers never wait on each other nor take the same row — and stamps
     `claimed_until = now + lease`, `attempts + 1`;
  2. after commit, each message's handler runs with NO transaction open (handlers call
     the provider through payments.services, which refuses an open transaction). The
     handlers are registered per category by the app that owns the work
     (recovery.outbox.outbox_handler, from each AppConfig.ready()): the relay imports
     no app;
  3. success sets `processed_at` (or releases the row to run once more if a write with
     its key came while it was claimed: `rerun`, recovery.outbox); failure records
     `last_error` and moves `available_at` by capped exponential backoff. Backoff lives
     only in `available_at` — never in a Celery countdown/eta, which a lost Redis would
     forget.
A worker that dies between 1 and 3 leaves the row claimed: once the lease passes, the
next drain (the on-commit kick or the beat sweep) claims it again. Every handler is
idempotent, so a message handled twice is harmless; the lease only keeps that rare.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.utils import timezone

from payments.errors import DomainError
from payments.locks import assert_outside_transaction
from payments.view_queries import execute_prepared

from .models import OutboxMessage
from .outbox import outbox_before_put, outbox_handler_for, outbox_handling

log = logging.getLogger(__name__)

# DomainError codes that mean "the follow-up is already done": the message is processed.
_DONE_CODES = frozenset({"already_settled", "already_dispatched", "not_dispatchable"})


# -- backoff --------------------------------------------------------------------------


def backoff_seconds(attempts: int) -> float:
    """Capped exponential backoff with a little jitter (attempts counts from 1)."""
    base: float = settings.OUTBOX_BACKOFF_BASE_SECONDS
    cap: float = settings.OUTBOX_BACKOFF_CAP_SECONDS
    delay: float = min(cap, base * (2 ** max(0, attempts - 1)))
    return delay * (1 + random.random() * 0.1)


# -- the relay ------------------------------------------------------------------------


class ClaimedMessage:
    """What a handler run needs of a claimed row (no model instance: ~8 us each, per
    message, for fields the relay never reads)."""

    __slots__ = ("id", "category", "payload", "attempts", "claimed_until")

    def __init__(
        self,
        id: int,
        category: int,
        payload: dict[str, Any],
        attempts: int,
        claimed_until: datetime,
    ) -> None:
        self.id, self.category, self.payload = id, category, payload
        self.attempts, self.claimed_until = attempts, claimed_until


_TABLE = OutboxMessage._meta.db_table
# Claim and stamp in ONE statement, autocommit: no BEGIN/COMMIT round trips. The row locks
# (FOR UPDATE SKIP LOCKED) are held until the statement's implicit commit, as the ORM
# path's atomic() held them: two drainers never claim the same row. RETURNING has no
# order: the outer SELECT hands the batch back oldest first, as the claim chose it.
_CLAIM_SQL = f"""
WITH due AS (
    SELECT id FROM "{_TABLE}"
    WHERE processed_at IS NULL AND available_at <= %s
      AND (claimed_until IS NULL OR claimed_until < %s)
    ORDER BY available_at, id LIMIT %s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE "{_TABLE}" m SET claimed_until = %s, attempts = m.attempts + 1, rerun = false
    FROM due WHERE m.id = due.id
    RETURNING m.id, m.category, m.payload, m.attempts, m.available_at
)
SELECT id, category, payload, attempts FROM claimed ORDER BY available_at, id
"""
# A row flagged `rerun` (a write with its key came while it was claimed: recovery.outbox)
# is released for another run instead: due now, attempts kept. Only rows this batch still
# holds (its claimed_until): a row released by an earlier flush and claimed again since
# belongs to its new drainer.
# No `processed_at IS NULL` here: `claimed_until = <this batch's>` already implies it
# (every write of processed_at clears claimed_until in the same UPDATE), and with it the
# planner may find the rows through the partial indexes on unprocessed rows instead of
# the primary key. On a table whose statistics count millions of processed rows those
# indexes look empty, so it did: every mark read the whole backlog (measured with 2 M
# processed rows: 6 ms a batch against 2 ms on empty tables, docs/performance.md).
_MARK_SQL = (
    f'UPDATE "{_TABLE}" SET processed_at = CASE WHEN rerun THEN NULL ELSE %s::timestamptz END, '
    "available_at = CASE WHEN rerun THEN %s::timestamptz ELSE available_at END, "
    "claimed_until = NULL, last_error = '', rerun = false "
    "WHERE id = ANY(%s::bigint[]) AND claimed_until = %s "
    "RETURNING processed_at IS NULL"
)  # true: released for another run


def _mark_values(now: datetime) -> dict[str, Any]:
    """The ORM path's `_MARK_SQL` SET: processed, or released when flagged `rerun`."""
    rerun = Q(rerun=True)
    return {
        "processed_at": Case(
            When(rerun, then=Value(None)), default=Value(now), output_field=DateTimeField()
        ),
        "available_at": Case(
            When(rerun, then=Value(now)), default=F("available_at"), output_field=DateTimeField()
        ),
        "claimed_until": None,
        "last_error": "",
        "rerun": False,
    }


def _sql_on(connection: BaseDatabaseWrapper) -> bool:
    """The relay's two hot statements as plain SQL (PostgreSQL); SQLite (the embedded
    `make run` default) keeps the ORM path."""
    return connection.vendor == "postgresql"


def _execute(sql: str, params: list[Any], *, fetch: bool) -> Any:
    """One statement on the default connection: on PostgreSQL a named prepared statement
    (planned once per connection, like the floor's psycopg loop); with prepared statements
    off, the same SQL on Django's own cursor."""
    return execute_prepared(sql, params, fetch="all" if fetch else None)


def _claim_sql(batch: int) -> list[ClaimedMessage]:
    now = timezone.now()
    claimed_until = now + timedelta(seconds=settings.OUTBOX_LEASE_SECONDS)
    rows = _execute(_CLAIM_SQL, [now, now, batch, claimed_until], fetch=True)
    # Django's psycopg setup loads jsonb as text (JSONField decodes it): decode it here.
    loads = json.loads
    return [
        ClaimedMessage(i, c, p if not isinstance(p, str) else loads(p), a, claimed_until)
        for i, c, p, a in rows
    ]


def _claim(batch: int) -> list[OutboxMessage] | list[ClaimedMessage]:
    if _sql_on(connections["default"]):
        return _claim_sql(batch)
    now = timezone.now()
    claimed_until = now + timedelta(seconds=settings.OUTBOX_LEASE_SECONDS)
    with transaction.atomic():
        rows = list(
            OutboxMessage.objects.select_for_update(skip_locked=True)
            .filter(processed_at__isnull=True, available_at__lte=now)
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            .order_by("available_at", "id")[:batch]
        )
        if not rows:
            return []
        OutboxMessage.objects.filter(id__in=[r.id for r in rows]).update(
            claimed_until=claimed_until, attempts=F("attempts") + 1, rerun=False
        )
    for row in rows:
        row.claimed_until = claimed_until
        row.attempts += 1
    return rows


def _succeed(message: OutboxMessage | ClaimedMessage) -> None:
    OutboxMessage.objects.filter(id=message.id, processed_at__isnull=True).update(
        **_mark_values(timezone.now())
    )


def _fail(message: OutboxMessage | ClaimedMessage, exc: BaseException) -> None:
    delay = backoff_seconds(message.attempts)
    # Type and message only: handlers raise DomainError/ORM errors, never provider payloads.
    error = f"{type(exc).__name__}: {exc}"[:1000]
    rows = OutboxMessage.objects.filter(id=message.id, processed_at__isnull=True)
    if isinstance(message, ClaimedMessage):
        # Only while this run's claim holds: a holder whose lease ran out and whose row was
        # claimed again must not cancel the new claim (a redundant later run).
        rows = rows.filter(claimed_until=message.claimed_until)
    rows.update(
        available_at=timezone.now() + timedelta(seconds=delay),
        claimed_until=None,
        last_error=error,
        rerun=False,
    )  # the next run sees the latest state anyway
    log.warning(
        "outbox message failed id=%s category=%s attempts=%s retry_in=%.1fs error=%s",
        message.id,
        message.category,
        message.attempts,
        delay,
        error,
    )


def _succeed_all(ids: list[int], claimed_until: datetime | None) -> None:
    """Mark a batch's handled messages processed in one UPDATE (those flagged `rerun`
    released for another run), if the batch (its `claimed_until`) still holds them."""
    if not ids:
        return
    now = timezone.now()
    if _sql_on(connections["default"]):
        # Runs in the caller's transaction when called from relay_flush_pending.
        rows = _execute(_MARK_SQL, [now, now, ids, claimed_until], fetch=True)
        released = sum(1 for (again,) in rows if again)
    else:
        batch = OutboxMessage.objects.filter(
            id__in=ids, processed_at__isnull=True, claimed_until=claimed_until
        )
        released = batch.filter(rerun=True).count()
        batch.update(**_mark_values(now))
    # A released row is due now: relay_drain takes another batch for it rather than
    # leaving it to the beat sweep.
    _released.count = getattr(_released, "count", 0) + released


_released = threading.local()


# The relay's batch of handled-but-not-yet-marked messages, per thread. A handler that
# writes an outbox row first marks them (recovery.outbox.outbox_put calls
# relay_flush_pending inside its transaction), so the dedupe index on unprocessed rows
# never absorbs a follow-up because an already handled message still looked unprocessed.
_batch = threading.local()


def relay_flush_pending() -> None:
    ids = getattr(_batch, "succeeded", None)
    if not ids:
        return
    flushed = _batch.flushed
    marked = [i for i in ids if i not in flushed]
    if marked:
        _succeed_all(marked, _batch.claimed_until)
        # Marked once per batch; if the caller's transaction rolls back, the batch's
        # final UPDATE (which covers every id again) marks them.
        flushed.update(marked)


outbox_before_put(relay_flush_pending)


def handle_message(
    message: OutboxMessage | ClaimedMessage, *, succeeded: list[int] | None = None
) -> bool:
    """Run one claimed message's handler outside any transaction. True on success.

    With `succeeded` (the relay's batch), a success is appended there and marked with the
    rest of the batch in one UPDATE instead of one per message."""

    def done(message: OutboxMessage | ClaimedMessage) -> None:
        if succeeded is None:
            _succeed(message)
        else:
            succeeded.append(message.id)

    handler = outbox_handler_for(message.category)
    try:
        if handler is None:
            raise LookupError(f"no handler for outbox category {message.category}")
        with outbox_handling(message.id):
            handler(message.payload)
    except DomainError as exc:
        if exc.code in _DONE_CODES:
            done(message)
            return True
        _fail(message, exc)
        return False
    except Exception as exc:  # any handler failure backs off; the row keeps the error
        _fail(message, exc)
        return False
    done(message)
    return True


def relay_drain_once(batch: int = 100) -> int:
    """Claim up to `batch` due messages and handle them; returns how many were claimed."""
    # Handlers may call the provider: never inside atomic().
    assert_outside_transaction()
    messages = _claim(batch)
    succeeded: list[int] = []
    claimed_until = messages[0].claimed_until if messages else None
    _batch.succeeded, _batch.flushed, _batch.claimed_until = succeeded, set(), claimed_until
    try:
        for message in messages:
            # A message whose lease ran out while earlier ones were handled may already be
            # claimed by another drainer: leave it to that one.
            assert message.claimed_until is not None  # claimed: the batch's lease
            if message.claimed_until < timezone.now():
                continue
            handle_message(message, succeeded=succeeded)
    finally:
        # Within the claim's lease: a drainer that dies before this line leaves the
        # batch's handled rows claimed; the next drain handles them again (idempotent).
        _batch.succeeded = _batch.flushed = _batch.claimed_until = None
        _succeed_all(succeeded, claimed_until)
    return len(messages)


def relay_drain(*, batch: int = 100, max_batches: int = 50) -> int:
    """Drain until nothing is due (bounded, so one task never runs forever)."""
    total = 0
    for _ in range(max_batches):
        _released.count = 0
        n = relay_drain_once(batch)
        total += n
        if n < batch and not _released.count:
            break
    return total
