"""Writing to the transactional outbox, and the registry of its handlers.

A leaf: it imports no app and no workflow module. The relay (recovery.relay) is kicked by
task name, and each app registers the handlers of its own categories (Sentry's receiver
pattern) from its AppConfig.ready(), so the relay runs them without importing any app
either. How a commit's kick is published (coalesced, recovery/kick.py) is registered the
same way, by recovery's AppConfig.ready(): the policy depends on the outbox, not the
reverse.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from celery import current_app
from django.db import transaction
from django.db.models import Field
from django.utils import timezone

from .models import OutboxCategory, OutboxMessage

RELAY_TASK = "recovery.relay_drain"

Handler = Callable[[dict[str, Any]], None]
Publish = Callable[[float | None], None]  # publish(countdown_seconds_or_None)
KickPolicy = Callable[[Publish], None]
_HANDLERS: dict[int, Handler] = {}


def outbox_handler(category: OutboxCategory) -> Callable[[Handler], Handler]:
    """Register the handler of one category (each takes the ids-only payload). One handler
    per category: registering a second, different one is a programming error."""

    def register(fn: Handler) -> Handler:
        current = _HANDLERS.get(int(category))
        if current is not None and current is not fn and current.__qualname__ != fn.__qualname__:
            raise RuntimeError(f"outbox category {category!r} already has a handler")
        _HANDLERS[int(category)] = fn
        return fn

    return register


def outbox_handler_for(category: int) -> Handler | None:
    return _HANDLERS.get(int(category))


_BEFORE_PUT: list[Callable[[], None]] = []


def outbox_before_put(hook: Callable[[], None]) -> Callable[[], None]:
    """Register a hook run before every outbox write, in the writer's transaction: the
    relay marks its batch's handled messages processed there, so the dedupe
    index on unprocessed rows never absorbs a follow-up of an already handled message."""
    if hook not in _BEFORE_PUT:
        _BEFORE_PUT.append(hook)
    return hook


def outbox_put(
    *, category: OutboxCategory, payload: dict[str, Any], dedupe_key: str, delay_seconds: float = 0
) -> None:
    """Write a message in the caller's transaction; kick the relay after commit.

    INSERT ... ON CONFLICT against the partial unique index on unprocessed dedupe keys: a
    duplicate while one is pending is absorbed, never an error; if the pending one is
    claimed (being handled), it is flagged to run once more (see `_INSERT_SQL`).
    """
    assert transaction.get_connection().in_atomic_block, "outbox_put needs the caller's atomic()"
    row = OutboxMessage(
        category=category,
        payload=payload,
        dedupe_key=dedupe_key,
        available_at=timezone.now() + timedelta(seconds=delay_seconds),
    )
    batch = getattr(_OUTBOX_BATCH, "rows", None)
    if batch is not None:
        batch.append(row)
    else:
        _outbox_insert([row])
    if delay_seconds <= 0:
        transaction.on_commit(_kick_relay, robust=True)


def _column(name: str) -> Field[Any, Any]:
    field = OutboxMessage._meta.get_field(name)
    assert isinstance(field, Field)  # a column of the table, never a reverse relation
    return field


_INSERT_FIELDS = [
    _column(name)
    for name in (
        "category",
        "payload",
        "dedupe_key",
        "available_at",
        "attempts",
        "last_error",
        "created_at",
    )
]
_TABLE = OutboxMessage._meta.db_table
# A duplicate of a pending row is absorbed (the partial unique index on unprocessed keys).
# If that row is claimed, its handler may have run already, before this write's state:
# flag it, and the relay releases it for another run instead of marking it processed
# (recovery.relay). An unclaimed pending row will run and see the latest state as it is.
# Same text on PostgreSQL and SQLite (both take ON CONFLICT with the index predicate).
_INSERT_SQL = (
    f'INSERT INTO "{_TABLE}" ({", ".join(str(f.column) for f in _INSERT_FIELDS)}) VALUES {{rows}} '
    "ON CONFLICT (dedupe_key) WHERE processed_at IS NULL "
    f'DO UPDATE SET rerun = TRUE WHERE "{_TABLE}".claimed_until IS NOT NULL '
    f'AND "{_TABLE}".id <> %s'
)
# The message this thread's relay is handling now (recovery.relay sets it). A handler that
# writes its own message's key again is absorbed, as before: flagging its own row would
# release it after every run and run it forever (it rewrites the key each time).
_HANDLING = threading.local()


@contextmanager
def outbox_handling(message_id: int) -> Iterator[None]:
    """While the relay runs `message_id`'s handler: a write of that message's own key is
    absorbed, never flagged to run again."""
    _HANDLING.id = message_id
    try:
        yield
    finally:
        _HANDLING.id = None


def _outbox_insert(rows: list[OutboxMessage]) -> None:
    for hook in _BEFORE_PUT:  # the relay marks its batch's handled messages first
        hook()
    # One row per key, the first (as DO NOTHING kept): DO UPDATE may not touch a row the
    # same statement inserted.
    rows = list({row.dedupe_key: row for row in reversed(rows)}.values())[::-1]
    if not rows:
        return
    connection = transaction.get_connection()
    size = connection.ops.bulk_batch_size(_INSERT_FIELDS, rows) or len(rows)
    one = "(" + ", ".join(["%s"] * len(_INSERT_FIELDS)) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), size):  # one statement, unless SQLite's limit
            chunk = rows[start : start + size]
            params = [
                f.get_db_prep_save(f.pre_save(row, True), connection)
                for row in chunk
                for f in _INSERT_FIELDS
            ]
            handling = getattr(_HANDLING, "id", None)
            cursor.execute(
                _INSERT_SQL.format(rows=", ".join([one] * len(chunk))),
                [*params, -1 if handling is None else handling],
            )


_OUTBOX_BATCH = threading.local()


@contextmanager
def outbox_batch() -> Iterator[None]:
    """Inside the caller's transaction: messages written by `outbox_put` are collected and
    inserted in one `INSERT … ON CONFLICT` when the block ends (discarded if it
    raises, as the transaction is). For a set-based apply (the reconcile sweep)."""
    if getattr(_OUTBOX_BATCH, "rows", None) is not None:
        yield  # already collecting: the outer block inserts
        return
    _OUTBOX_BATCH.rows = []
    try:
        yield
        rows = _OUTBOX_BATCH.rows
        _OUTBOX_BATCH.rows = None
        if rows:
            _outbox_insert(rows)
    finally:
        _OUTBOX_BATCH.rows = None


# -- the messages several apps write: one helper each owns the dedupe key ---------------


def run_steps_put(*, purchase_id: str) -> None:
    """Run (or resume) a purchase's downstream steps. One pending message per purchase,
    whoever asks: a settled payment, a cleared halt, a person's resume."""
    outbox_put(
        category=OutboxCategory.RUN_STEPS,
        payload={"purchase": purchase_id},
        dedupe_key=f"steps:{purchase_id}",
    )


def dispatch_put(*, operation_id: str) -> None:
    """Send an operation to the provider (a compensation, a duplicate's refund)."""
    outbox_put(
        category=OutboxCategory.DISPATCH,
        payload={"operation": operation_id},
        dedupe_key=f"dispatch:{operation_id}",
    )


def operation_settled_put(*, operation_id: str) -> None:
    """An operation reached its outcome: the workflow follows it."""
    outbox_put(
        category=OutboxCategory.OPERATION_SETTLED,
        payload={"operation": operation_id},
        dedupe_key=f"settled:{operation_id}",
    )


def reconcile_put(
    *,
    operation_id: str,
    delay_seconds: float = 0,
    event_id: str = "",
    due_now: bool = False,
    even_after_failure: bool = False,
) -> None:
    """Read an operation back from its provider (payments.services.operation_reconcile).
    One pending message per operation (`reconcile:<id>`): a later put is absorbed by the
    one already queued, at that one's time.

    - `delay_seconds`: when it is due (the reconcile schedule's next step).
    - `event_id`: a provider event's own prompt, under its own key, which the scheduled
      (delayed) message cannot absorb.
    - `due_now`: a message already queued for later is made due now, unless it already
      failed (it keeps its own backoff) — or even then, with `even_after_failure` (a held
      event's read-back, bounded by the event's own cadence)."""
    key = f"reconcile:{operation_id}:{event_id}" if event_id else f"reconcile:{operation_id}"
    outbox_put(
        category=OutboxCategory.RECONCILE,
        payload={"operation": operation_id},
        dedupe_key=key,
        delay_seconds=delay_seconds,
    )
    if not due_now:
        return
    queued_for_later = OutboxMessage.objects.filter(
        category=OutboxCategory.RECONCILE,
        dedupe_key=key,
        processed_at__isnull=True,
        available_at__gt=timezone.now(),
    )
    if not even_after_failure:
        queued_for_later = queued_for_later.filter(attempts=0)
    queued_for_later.update(available_at=timezone.now())


def _kick_at_once(publish: Publish) -> None:
    publish(None)


# One slot: the policy that publishes a commit's kick. Every commit publishes until recovery
# installs its coalesced kick (RecoveryConfig.ready()), which every process runs at setup.
_KICK_POLICY: list[KickPolicy] = [_kick_at_once]


def outbox_kick_policy(policy: KickPolicy) -> KickPolicy:
    """Install how a commit's kick reaches the relay: `policy(publish)` calls
    `publish(countdown)` zero or more times (recovery/kick.py coalesces to at most two per
    window). The last installed policy wins."""
    _KICK_POLICY[0] = policy
    return policy


def outbox_kick_policy_installed() -> KickPolicy:
    return _KICK_POLICY[0]


def relay_kick() -> None:
    """Kick the relay now (after commit); the beat sweep is the backstop."""
    transaction.on_commit(_kick_relay, robust=True)


def _kick_relay() -> None:
    # By name: the outbox imports no task module (recovery.tasks imports the relay, which
    # imports the handlers' apps). retry=False: with the broker down, fail at once instead
    # of holding the committed request for Celery's publish retries (measured ~3 s per
    # kick). The row is already committed; the beat's sweep re-kicks the relay when the
    # broker is back.
    # Through the installed policy: coalesced by recovery.kick (at most two publishes per
    # short window, not one per row).
    _KICK_POLICY[0](
        lambda countdown: current_app.send_task(RELAY_TASK, retry=False, countdown=countdown)
    )
