"""Writing storefront events, in the transaction of the change they report.

A leaf: payments' services call `event_record_transition` from the one function that
records every transition of a purchase or an operation (payments.services.common.
transition_record), so an event exists if and only if its change committed. Each event
gets the purchase's next sequence number (an upsert, never read-then-write) and the
purchase view as its transaction leaves it, built by the presenter that events.apps
registers (the API's own). Its delivery starts from an outbox row written in
the same transaction (category EVENT_FANOUT, events.delivery).

Inside `event_batch()` (a service's whole change, in its transaction) the events are
collected and written when the block ends: the view built once per purchase, the
sequence numbers taken in one upsert, the rows inserted in one statement. What is written
is what one-by-one recording writes: every event of a purchase in one transaction carries
the view that transaction leaves, and the sequence numbers follow the recording order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Field
from django.utils import timezone

from payments.enums import OperationKind, Origin, Outcome, Verification
from recovery.models import OutboxCategory
from recovery.outbox import (
    JoinedWrite,
    outbox_joined_name,
    outbox_joins,
    outbox_put,
    outbox_write_joined,
    relay_kick,
)

from .models import Event, EventType, PurchaseEventCounter

# purchase id -> (its API client's id, the purchase view)
ViewBuilder = Callable[[str], tuple[str, dict]]
_VIEW: list[ViewBuilder | None] = [None]


def event_view_register(builder: ViewBuilder) -> None:
    """Install the purchase presenter (events.apps). The last one installed wins."""
    _VIEW[0] = builder


_GROUP = {
    OperationKind.CHARGE: "payment",
    OperationKind.AUTHORIZE: "payment",
    OperationKind.CAPTURE: "capture",
    OperationKind.VOID: "void",
    OperationKind.REFUND: "refund",
}
_SETTLED: dict[str, str] = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.FAILED: "failed",
    Outcome.UNKNOWN: "unknown",
}
# An outcome that was still open: settling from one of these is "resolved" for a payment.
_OPEN = {Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER}
_DISPUTE_CLOSED = {"won", "lost", "warning_closed", "charge_refunded"}
# Who settled an operation, in the storefront's words (never a staff member's name).
_RESOLVED_BY = {
    Verification.PROVIDER: "provider",
    Verification.WEBHOOK: "provider",
    Verification.MANUAL: "support",
    Verification.UNVERIFIED: "verity",
}


def _operation_type(op, source: str, target: str) -> str | None:
    if op.origin == Origin.PROVIDER and not source:
        return EventType.MONEY_MOVED_OUTSIDE
    if source == target:
        return None
    group = _GROUP[OperationKind(op.kind)]
    if group == "refund" and not source:
        return EventType.REFUND_REQUESTED
    word = _SETTLED.get(target)
    if word is None:
        return None
    if group == "payment" and source in _OPEN and word != "unknown":
        return EventType.PAYMENT_RESOLVED
    return EventType(f"{group}.{word}")


def _status_type(source: str, target: str) -> str | None:
    if not source:
        return EventType.PURCHASE_CREATED
    if source == target:
        return None
    if target == "completed":
        return EventType.PURCHASE_COMPLETED
    return EventType.PURCHASE_STATUS_CHANGED


def _dispute_type(source: str, target: str) -> str | None:
    if source == target:
        return None
    if target in _DISPUTE_CLOSED:
        return EventType.DISPUTE_CLOSED
    return EventType.DISPUTE_OPENED if not source else EventType.DISPUTE_UPDATED


def event_record_transition(
    *,
    purchase_id: str,
    operation,
    field: str,
    source: str,
    target: str,
    cause: str,
    evidence: dict | None,
) -> Event | None:
    """The event a recorded transition makes, if it makes one (caller's transaction)."""
    source, target = str(source or ""), str(target or "")
    change: dict = {}
    if field == "status":
        event_type = _status_type(source, target)
        change = {"previous_status": source or None, "status": target}
    elif field == "dispute":
        event_type = _dispute_type(source, target)
        evidence = evidence or {}
        change = {
            "dispute": {
                "id": evidence.get("id"),
                "status": target,
                "previous_status": source or None,
                "outcome": target if target in _DISPUTE_CLOSED else None,
                "amount": evidence.get("amount"),
                "currency": evidence.get("currency"),
                "reason": evidence.get("reason"),
            }
        }
    elif field == "outcome" and operation is not None:
        event_type = _operation_type(operation, source, target)
        change = {
            "operation": {
                "id": operation.id,
                "kind": str(operation.kind),
                "outcome": target,
                "previous_outcome": source or None,
                "amount": operation.amount,
                "currency": operation.currency,
                "origin": str(operation.origin),
                "grade": str(operation.grade or "") or None,
                "reason": str(operation.reason or "") or None,
                "settled_by": (
                    _RESOLVED_BY.get(operation.verification) if target in _SETTLED else None
                ),
            }
        }
    else:
        event_type = None
    if event_type is None:
        return None
    return event_record(
        purchase_id=purchase_id, event_type=event_type, change={**change, "cause": cause or None}
    )


def event_record(*, purchase_id: str, event_type: str, change: dict) -> Event | None:
    """Write one event and its fan-out message (caller's transaction); inside
    `event_batch()`, collect it for the block's end (and return None)."""
    assert connection.in_atomic_block, "an event is written in its change's transaction"
    pending = _Pending(purchase_id, str(event_type), change, timezone.now())
    batch = getattr(_BATCH, "pending", None)
    if batch is not None:
        batch.append(pending)
        return None
    return _events_write([pending])[0]


@dataclass(frozen=True)
class _Pending:
    purchase_id: str
    event_type: str
    change: dict
    created_at: datetime


_BATCH = threading.local()


@contextmanager
def event_batch() -> Iterator[None]:
    """Inside the caller's transaction: events recorded in the block are written when it
    ends (discarded if it raises, as the transaction is). Enter it inside the outbox's
    batch (recovery.outbox.outbox_batch) so the fan-out messages join that one insert."""
    if getattr(_BATCH, "pending", None) is not None:
        yield  # already collecting: the outer block writes
        return
    _BATCH.pending = []
    try:
        yield
        pending = _BATCH.pending
        _BATCH.pending = None
        if pending:
            if outbox_joins():
                _events_write_joined(pending)
            else:
                _events_write(pending)
    finally:
        _BATCH.pending = None


def _events_of(pending: list[_Pending]) -> tuple[list[Event], dict[str, int], dict]:
    """The events of `pending`, in their order, each carrying its purchase's view (built
    once, as the transaction leaves it; `sequence`: its place among its purchase's events
    here), how many each purchase has, and the views."""
    builder = _VIEW[0]
    views: dict[str, tuple[str, dict]] = {}
    counts: dict[str, int] = {}
    for item in pending:
        counts[item.purchase_id] = counts.get(item.purchase_id, 0) + 1
        if item.purchase_id not in views:
            views[item.purchase_id] = (
                builder(item.purchase_id) if builder is not None else ("", {"id": item.purchase_id})
            )
    events: list[Event] = []
    seen = dict.fromkeys(counts, 0)
    for item in pending:
        api_client_id, view = views[item.purchase_id]
        seen[item.purchase_id] += 1
        events.append(
            Event(
                api_client_id=api_client_id or "",
                purchase_id=item.purchase_id,
                sequence=seen[item.purchase_id],  # within this write; numbered on insert
                type=item.event_type,
                created_at=item.created_at,
                data={"purchase": view, **item.change},
            )
        )
    return events, counts, views


def _events_write(pending: list[_Pending]) -> list[Event]:
    """The events of `pending`, in their order: each purchase's view built once, as the
    transaction leaves it, and its sequence numbers taken in recording order."""
    events, counts, views = _events_of(pending)
    _events_insert_numbered(events, counts)
    _events_written(events, views)
    for event in events:
        outbox_put(
            category=OutboxCategory.EVENT_FANOUT,
            payload={"event": event.id},
            dedupe_key=f"event:{event.id}",
        )
    return events


def _events_written(events: list[Event], views: dict) -> None:
    for purchase_id, (_client, view) in views.items():
        _same_transaction_views(
            purchase_id, [e.id for e in events if e.purchase_id == purchase_id], view
        )


def _events_write_joined(pending: list[_Pending]) -> None:
    """`_events_write` inside an outbox batch on PostgreSQL: the numbers taken, the events
    inserted and their fan-out messages (`event:<id>`, as `_events_write` puts them) go in
    the batch's one statement (recovery.outbox.outbox_write_joined)."""
    events, counts, views = _events_of(pending)
    take, ev = outbox_joined_name("event_numbers"), outbox_joined_name("events")
    take_sql, take_params, insert_sql, insert_params = _numbered_insert(events, counts, take)

    def after(rows: list[dict]) -> None:
        _events_numbered(events, counts, [(r["id"], r["purchase_id"], r["sequence"]) for r in rows])
        _events_written(events, views)
        relay_kick()  # as outbox_put does for a message due now

    now = timezone.now()
    fanout = (
        f"(SELECT %s, jsonb_build_object('event', {ev}.id), 'event:' || {ev}.id, "
        f"%s::timestamptz, 0, '', %s::timestamptz FROM {ev} ORDER BY {ev}.id)"
    )
    outbox_write_joined(
        JoinedWrite(
            ctes=((take, take_sql, take_params), (ev, insert_sql, insert_params)),
            returning=ev,
            after=after,
            messages=(fanout, (int(OutboxCategory.EVENT_FANOUT), now, now)),
        )
    )


_COUNTER = PurchaseEventCounter._meta.db_table
_EVENT = Event._meta.db_table
# Take `n` numbers of each purchase: the counter's row lock orders concurrent writers of one
# purchase (they hold the purchase's lock already); rows in id order, so two writers never
# wait on each other in a cycle. Same text on PostgreSQL and SQLite.
_TAKE_SQL = (
    f'INSERT INTO "{_COUNTER}" (purchase_id, last) VALUES {{rows}} '
    f'ON CONFLICT (purchase_id) DO UPDATE SET last = "{_COUNTER}".last + excluded.last '
    "RETURNING purchase_id, last"
)
_COLUMNS = ("public_id", "api_client_id", "purchase_id", "type", "data", "created_at")
# PostgreSQL: the events inserted with the numbers `_TAKE_SQL` took (the CTE named
# `{taken}`), in the same statement. `back` is how far an event is from its purchase's last
# number taken here.
_INSERT_NUMBERED_SQL = (
    f'INSERT INTO "{_EVENT}" ({", ".join(_COLUMNS)}, sequence) '
    f"SELECT {', '.join('v.' + c for c in _COLUMNS)}, {{taken}}.last - v.back "
    "FROM (VALUES {values}) AS "
    f"v(ord, back, {', '.join(_COLUMNS)}) "
    "JOIN {taken} ON {taken}.purchase_id = v.purchase_id ORDER BY v.ord "
    "RETURNING id, purchase_id, sequence"
)


def _column(name: str) -> Field:
    field = Event._meta.get_field(name)
    assert isinstance(field, Field)  # a column of the table, never a reverse relation
    return field


_FIELDS = [_column(name) for name in _COLUMNS]
_VALUE = "(%s::integer, %s::integer, %s, %s, %s, %s, %s::jsonb, %s::timestamptz)"


def _events_insert_numbered(events: list[Event], counts: dict[str, int]) -> None:
    """Insert `events` (each `sequence` its place, from 1, among its purchase's events
    here; `counts` how many each purchase has) numbered after their purchase's last event,
    in their order; each gets its id and sequence number."""
    if connection.vendor != "postgresql":
        ids = sorted(counts)
        take = _TAKE_SQL.format(rows=", ".join(["(%s, %s)"] * len(ids)))
        with connection.cursor() as cursor:
            cursor.execute(take, [value for pid in ids for value in (pid, counts[pid])])
            taken = dict(cursor.fetchall())
        for event in events:
            event.sequence = taken[event.purchase_id] - counts[event.purchase_id] + event.sequence
        Event.objects.bulk_create(events)
        return
    take_sql, take_params, insert_sql, insert_params = _numbered_insert(events, counts, "taken")
    with connection.cursor() as cursor:
        cursor.execute(f"WITH taken AS ({take_sql}) {insert_sql}", [*take_params, *insert_params])
        rows = cursor.fetchall()
    _events_numbered(events, counts, rows)


def _numbered_insert(
    events: list[Event], counts: dict[str, int], taken: str
) -> tuple[str, tuple, str, tuple]:
    """PostgreSQL: the numbers' upsert and the events' insert that reads them (as the CTE
    named `taken`), each with its params."""
    ids = sorted(counts)
    take_params = tuple(value for pid in ids for value in (pid, counts[pid]))
    take = _TAKE_SQL.format(rows=", ".join(["(%s, %s)"] * len(ids)))
    params: list = []
    for position, event in enumerate(events):
        params += [position, counts[event.purchase_id] - event.sequence]
        params += [f.get_db_prep_save(f.pre_save(event, True), connection) for f in _FIELDS]
    sql = _INSERT_NUMBERED_SQL.replace("{values}", ", ".join([_VALUE] * len(events)))
    return take, take_params, sql.replace("{taken}", taken), tuple(params)


def _events_numbered(events: list[Event], counts: dict[str, int], rows) -> None:
    """Each event's id and sequence number, from the insert's (id, purchase_id, sequence)."""
    last: dict[str, int] = {}
    numbered: dict[tuple[str, int], int] = {}
    for pk, pid, sequence in rows:
        last[pid] = max(last.get(pid, 0), sequence)
        numbered[(pid, sequence)] = pk
    for event in events:
        event.sequence = last[event.purchase_id] - counts[event.purchase_id] + event.sequence
        event.id = numbered[(event.purchase_id, event.sequence)]


# The events this transaction wrote, per purchase: {purchase_id: [event ids]}. Valid while
# its marker (an on-commit callback of this transaction) is still pending on the
# connection: a commit runs it (and forgets), a rollback drops it (so does a rolled-back
# savepoint: then a later event only leaves the earlier views as they were).
_WRITTEN = threading.local()


def _written_in_this_transaction() -> dict[str, list[int]]:
    marker = getattr(_WRITTEN, "marker", None)
    if marker is None or not any(entry[1] is marker for entry in connection.run_on_commit):

        def marker() -> None:
            if getattr(_WRITTEN, "marker", None) is marker:
                _WRITTEN.marker, _WRITTEN.ids = None, {}

        _WRITTEN.marker, _WRITTEN.ids = marker, {}
        connection.on_commit(marker)
    return _WRITTEN.ids


def _same_transaction_views(purchase_id: str, event_ids: list[int], view: dict) -> None:
    """Every event a transaction writes about one purchase carries the view that
    transaction leaves: an operation's outcome is saved before the purchase status that
    follows from it, and a `payment.failed` whose view still said `payment_pending` would
    tell the storefront a state that never committed. So a later event of the same
    purchase in the same transaction brings its earlier ones' view up to date."""
    earlier = _written_in_this_transaction().setdefault(purchase_id, [])
    if earlier:
        table = Event._meta.db_table
        placeholders = ", ".join(["%s"] * len(earlier))
        if connection.vendor == "postgresql":
            sql = (
                f"UPDATE \"{table}\" SET data = jsonb_set(data, '{{purchase}}', %s::jsonb) "
                f"WHERE id IN ({placeholders})"
            )
        else:
            sql = (
                f"UPDATE \"{table}\" SET data = json_set(data, '$.purchase', json(%s)) "
                f"WHERE id IN ({placeholders})"
            )
        with connection.cursor() as cursor:
            cursor.execute(sql, [json.dumps(view), *earlier])
    earlier.extend(event_ids)
