"""An independent judge of storefront events: raw rows only (events, the purchase's
history, the outbox), never the code that writes them."""

from __future__ import annotations

from django.db import connection

FANOUT = 40  # recovery.models.OutboxCategory.EVENT_FANOUT, as stored


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def event_rows(purchase_id: str) -> list[tuple[int, int, str, str, str]]:
    """(id, sequence, type, view status, event's own `status` field) in sequence order."""
    return _rows(
        "SELECT id, sequence, type, data->'purchase'->>'status', data->>'status' "
        "FROM events_event WHERE purchase_id = %s ORDER BY sequence",
        [purchase_id],
    )


def status_history(purchase_id: str) -> list[tuple[str, str]]:
    """The purchase's committed status moves (source, target), in the order recorded."""
    return _rows(
        "SELECT source, target FROM payments_operationtransition "
        "WHERE purchase_id = %s AND field = 'status' AND operation_id IS NULL "
        "AND source <> target ORDER BY id",
        [purchase_id],
    )


def purchase_status(purchase_id: str) -> str:
    return _rows("SELECT status FROM payments_purchase WHERE id = %s", [purchase_id])[0][0]


def violations(purchase_id: str) -> list[str]:
    """What is wrong with one purchase's events (empty: nothing)."""
    out: list[str] = []
    events = event_rows(purchase_id)
    seqs = [e[1] for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        out.append(f"sequence not gapless from 1: {seqs}")
    counter = _rows(
        "SELECT last FROM events_purchaseeventcounter WHERE purchase_id = %s", [purchase_id]
    )
    if events and (not counter or counter[0][0] != len(events)):
        out.append(f"counter {counter} but {len(events)} events")
    # Every committed status move has its event, and no event names a move never made.
    moves = status_history(purchase_id)
    status_events = [
        e[4]
        for e in events
        if e[2] in ("purchase.created", "purchase.status_changed", "purchase.completed")
    ]
    if status_events != [t for _, t in moves]:
        out.append(f"status events {status_events} != committed moves {[t for _, t in moves]}")
    # Each view is a state the purchase had, walked forward in sequence order.
    walk = [t for _, t in moves]
    position = 0
    for _id, seq, etype, view_status, _ in events:
        if view_status not in walk[position:]:
            out.append(
                f"event {seq} {etype}: view status {view_status!r} is not a later state of "
                f"{walk} (from position {position})"
            )
            continue
        position = walk.index(view_status, position)
    if events and events[-1][3] != purchase_status(purchase_id):
        out.append(
            f"last event's view says {events[-1][3]!r}, purchase is "
            f"{purchase_status(purchase_id)!r}"
        )
    # One fan-out message per event, and none for an event that does not exist.
    ids = {e[0] for e in events}
    fanout = [
        int(r[0])
        for r in _rows(
            "SELECT payload->>'event' FROM recovery_outboxmessage WHERE category = %s",
            [FANOUT],
        )
    ]
    mine = [i for i in fanout if i in ids]
    if sorted(mine) != sorted(ids):
        out.append(f"fan-out rows {sorted(mine)} for events {sorted(ids)}")
    return out


def orphan_fanout() -> list[int]:
    """Fan-out messages naming an event that does not exist."""
    return [
        int(r[0])
        for r in _rows(
            "SELECT (payload->>'event') FROM recovery_outboxmessage m WHERE category = %s "
            "AND NOT EXISTS (SELECT 1 FROM events_event e "
            "WHERE e.id = (m.payload->>'event')::bigint)",
            [FANOUT],
        )
    ]


def orphan_events() -> list[str]:
    """Events of a purchase that does not exist."""
    return [
        r[0]
        for r in _rows(
            "SELECT e.purchase_id FROM events_event e WHERE NOT EXISTS "
            "(SELECT 1 FROM payments_purchase p WHERE p.id = e.purchase_id)"
        )
    ]
