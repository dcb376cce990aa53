"""Writing to the transactional outbox, and the registry of its handlers.

A leaf: it imports no app and no workflow module. The relay (recovery.relay) is kicked by
task name, and each app registers the handlers of its own categories (Sentry's receiver
pattern) from its AppConfig.ready(), so the relay runs them without importing any app
either. How a commit's kick is published (coalesced, recovery/kick.py) is registered the
same way, by recovery's AppConfig.ready(): the policy depends on the outbox, not the
reverse.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    rows = _one_per_key(rows)
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


def _one_per_key(rows: list[OutboxMessage]) -> list[OutboxMessage]:
    # One row per key, the first (as DO NOTHING kept): DO UPDATE may not touch a row the
    # same statement inserted.
    return list({row.dedupe_key: row for row in reversed(rows)}.values())[::-1]


_OUTBOX_BATCH = threading.local()


@contextmanager
def outbox_batch() -> Iterator[None]:
    """Inside the caller's transaction: messages written by `outbox_put` are collected and
    inserted in one `INSERT … ON CONFLICT` when the block ends (discarded if it
    raises, as the transaction is). For a set-based apply (the reconcile sweep).

    Other writes of the same change join that statement (`outbox_write_joined`): each is
    deferred to the block's end, so the code inside must not read back what it joined."""
    if getattr(_OUTBOX_BATCH, "rows", None) is not None:
        yield  # already collecting: the outer block inserts
        return
    _OUTBOX_BATCH.rows = []
    _OUTBOX_BATCH.joined = []
    try:
        yield
        rows, joined = _OUTBOX_BATCH.rows, _OUTBOX_BATCH.joined
        _OUTBOX_BATCH.rows = _OUTBOX_BATCH.joined = None
        if joined:
            _joined_write(rows, joined)
        elif rows:
            _outbox_insert(rows)
    finally:
        _OUTBOX_BATCH.rows = _OUTBOX_BATCH.joined = None


# -- other writes of a change, in the outbox's statement ----------------------------------
#
# A change ends with writes that read nothing back before its commit: its history rows,
# its storefront events, its outbox messages, the answer of the provider call it applies,
# the idempotency key it binds or completes. On PostgreSQL they go in ONE statement, each
# a data-modifying CTE (all run, referenced or not, on the statement's one snapshot: none
# may read another's rows, except through RETURNING), the outbox insert last; a CTE's
# RETURNING rows come back to its writer. Elsewhere (SQLite) each is its own statement.

_CTE_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")
_MESSAGES_CTE = "outbox_messages"  # the batch's own insert


@dataclass(frozen=True)
class JoinedWrite:
    """`ctes`: (name, data-modifying statement, its params), in order; a later one may read
    an earlier one's RETURNING rows by its name. `after(rows)`: the rows (dicts) that the
    CTE named `returning` returned, once the statement ran. `messages`: a SELECT of outbox
    rows (the columns of `_INSERT_FIELDS`, in order) from these CTEs, with its params:
    messages whose ids come from this write (an event's fan-out), inserted with the batch's
    own. A CTE's name is unique in its batch (`outbox_joined_name`)."""

    ctes: tuple[tuple[str, str, tuple[Any, ...]], ...]
    returning: str | None = None
    after: Callable[[list[dict[str, Any]]], None] | None = None
    messages: tuple[str, tuple[Any, ...]] | None = None


def outbox_joins() -> bool:
    """Whether a write made now joins an open batch's one statement (PostgreSQL only)."""
    return (
        getattr(_OUTBOX_BATCH, "joined", None) is not None
        and transaction.get_connection().vendor == "postgresql"
    )


def outbox_joined_name(base: str) -> str:
    """A CTE name not yet taken in the open batch (`base` itself, or numbered)."""
    joined = getattr(_OUTBOX_BATCH, "joined", None) or ()
    taken = {name for write in joined for name, *_ in write.ctes}
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def outbox_write_joined(write: JoinedWrite) -> None:
    """Inside an outbox batch on PostgreSQL: deferred to the batch's one statement. Else
    written now, each CTE its own statement (`messages` only joins a batch)."""
    if outbox_joins():
        _OUTBOX_BATCH.joined.append(write)
        return
    assert write.messages is None, "messages from a write's rows join a batch only"
    returned: list[dict[str, Any]] = []
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        for name, sql, params in write.ctes:
            cursor.execute(sql, list(params))
            if name == write.returning:
                columns = [c[0] for c in cursor.description or ()]
                returned = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    if write.after is not None:
        write.after(returned)


def rows_insert_sql(rows: list[Any]) -> tuple[str, tuple[Any, ...]]:
    """The INSERT of new model instances of one model (their primary key the database's),
    for a CTE: what `bulk_create` would insert, without the ids coming back."""
    model = type(rows[0])
    connection = transaction.get_connection()
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params = tuple(
        f.get_db_prep_save(f.pre_save(row, True), connection) for row in rows for f in fields
    )
    table = connection.ops.quote_name(model._meta.db_table)
    return f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * len(rows))}", params


# `row_update_sql`'s value for "the database's clock when the statement runs".
DATABASE_NOW: Any = object()


def row_update_sql(
    model: Any, pk: Any, values: dict[str, Any], *, where: dict[str, Any] | None = None
) -> tuple[str, tuple[Any, ...]]:
    """`UPDATE` of one row of `model` (by primary key, and `where`: more columns it must
    still have), for a CTE: each value through its field, as the ORM saves it;
    `DATABASE_NOW` is the database's clock (PostgreSQL)."""
    connection = transaction.get_connection()
    qn = connection.ops.quote_name
    sets, params = [], []
    for name, value in values.items():
        field = model._meta.get_field(name)
        if value is DATABASE_NOW:
            sets.append(f"{qn(field.column)} = STATEMENT_TIMESTAMP()")
            continue
        sets.append(f"{qn(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection))
    conditions = [f"{qn(model._meta.pk.column)} = %s"]
    params.append(model._meta.pk.get_db_prep_save(pk, connection))
    for name, value in (where or {}).items():
        field = model._meta.get_field(name)
        conditions.append(f"{qn(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection))
    table = qn(model._meta.db_table)
    sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {' AND '.join(conditions)}"
    return sql, tuple(params)


def _joined_write(rows: list[OutboxMessage], joined: list[JoinedWrite]) -> None:
    """The batch's messages and its joined writes in one statement (PostgreSQL)."""
    ctes: list[str] = []
    params: list[Any] = []
    for write in joined:
        for name, sql, values in write.ctes:
            assert _CTE_NAME.match(name) and name != _MESSAGES_CTE, name
            ctes.append(f"{name} AS ({sql})")
            params += values
    rows = _one_per_key(rows)
    selects = [write.messages for write in joined if write.messages is not None]
    if rows or selects:
        for hook in _BEFORE_PUT:  # the relay marks its batch's handled messages first
            hook()
        connection = transaction.get_connection()
        parts = []
        if rows:
            one = "(" + ", ".join(["%s"] * len(_INSERT_FIELDS)) + ")"
            parts.append("VALUES " + ", ".join([one] * len(rows)))
            params += [
                f.get_db_prep_save(f.pre_save(row, True), connection)
                for row in rows
                for f in _INSERT_FIELDS
            ]
        for sql, values in selects:
            parts.append(sql)
            params += values
        handling = getattr(_HANDLING, "id", None)
        insert = _INSERT_SQL.replace("VALUES {rows}", " UNION ALL ".join(parts))
        ctes.append(f"{_MESSAGES_CTE} AS ({insert})")
        params.append(-1 if handling is None else handling)
    answers = [w for w in joined if w.returning is not None]
    final = " UNION ALL ".join(
        f"SELECT {i}, row_to_json({w.returning}.*)::text FROM {w.returning}"
        for i, w in enumerate(answers)
    )
    sql = f"WITH {', '.join(ctes)} " + (final or "SELECT NULL, NULL WHERE FALSE")
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    for i, write in enumerate(answers):
        if write.after is not None:
            write.after([json.loads(text) for part, text in found if part == i])
    for write in joined:
        if write.returning is None and write.after is not None:
            write.after([])


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
