"""The relay's claim and mark read one batch, however many processed rows the outbox keeps.

Retention keeps processed outbox rows for days (millions of them), and with 5 M of them the
drain was ~16 % slower than on empty tables (bench/history.py, docs/performance.md): the
mark found its batch through a partial index of unprocessed rows, which statistics that
count the processed history make look empty, and read the whole backlog; the claim read
every due row sharing one available_at (a batch written by one statement) to sort them by
id. The effect measured here is what each statement reads from the outbox (PostgreSQL's
own EXPLAIN ANALYZE row counts), with the custom plan and with the generic one (the
relay's statements are prepared: after five runs PostgreSQL may keep a generic plan).
"""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from recovery.models import OutboxCategory, OutboxMessage
from recovery.relay import _CLAIM_SQL, _MARK_SQL, relay_drain

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = OutboxMessage._meta.db_table
BATCH = 100
BACKLOG = 1500


def _numbered(sql: str) -> str:
    """Django's %s placeholders as $1, $2, … (PREPARE's)."""
    parts = sql.split("%s")
    return "".join(p + (f"${i + 1}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))


def _rows_read(plan: dict) -> int:
    """Rows the plan's scans of the outbox (its heap or any of its indexes) looked at."""
    with connection.cursor() as c:
        c.execute(
            "SELECT relname FROM pg_class WHERE oid IN "
            "(SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)",
            [TABLE],
        )
        indexes = {r[0] for r in c.fetchall()}
    total, nodes = 0, [plan]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if node["Node Type"] == "ModifyTable":  # the rows it writes were read below it
            continue
        if node.get("Relation Name") == TABLE or (
            "Relation Name" not in node and node.get("Index Name") in indexes
        ):
            looked = (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
            total += looked * node.get("Actual Loops", 1)
    return total


def _explain_execute(name: str, sql: str, params: list) -> tuple[int, list]:
    """Run a prepared statement once under EXPLAIN ANALYZE: (rows it read, its rows)."""
    with connection.cursor() as c:
        c.execute(f"PREPARE {name} AS {_numbered(sql)}")
        # Django's psycopg cursor binds client-side: the values go in as literals.
        c.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}("
            + ", ".join(["%s"] * len(params))
            + ")",
            params,
        )
        plan = c.fetchone()[0]
        c.execute(f"DEALLOCATE {name}")
    plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return _rows_read(plan), plan


def test_claim_and_mark_read_one_batch_with_history_kept():
    if connection.vendor != "postgresql":
        pytest.skip("the cost measured is PostgreSQL's plan")
    # given 6 000 processed messages kept (history), statistics refreshed as autovacuum
    # would: they count no unprocessed row at all
    with connection.cursor() as c:
        c.execute(
            f"""
            INSERT INTO {TABLE} (category, payload, dedupe_key, available_at, attempts,
                                 last_error, processed_at, created_at)
            SELECT %s, '{{}}'::jsonb, 'hist:' || g, now() - interval '2 days', 1, '',
                   now() - interval '2 days', now() - interval '2 days'
            FROM generate_series(1, 6000) AS g""",
            [OutboxCategory.NOOP.value],
        )
        c.execute(f"ANALYZE {TABLE}")
        # and a backlog written by one statement: one available_at for all of it
        c.execute(
            f"""
            INSERT INTO {TABLE} (category, payload, dedupe_key, available_at, attempts,
                                 last_error, created_at)
            SELECT %s, '{{}}'::jsonb, 'due:' || g, now() - interval '1 second', 0, '', now()
            FROM generate_series(1, {BACKLOG}) AS g""",
            [OutboxCategory.NOOP.value],
        )

    for mode in ("force_custom_plan", "force_generic_plan"):
        with connection.cursor() as c:
            c.execute(f"SET plan_cache_mode = {mode}")
        try:
            # when a batch is claimed and marked with the relay's own statements
            now = timezone.now()
            until = now + timedelta(seconds=60)
            claim_read, _ = _explain_execute("claim_t", _CLAIM_SQL, [now, now, BATCH, until])
            ids = list(
                OutboxMessage.objects.filter(claimed_until=until).values_list("id", flat=True)
            )
            mark_read, _ = _explain_execute("mark_t", _MARK_SQL, [now, now, ids, until])
        finally:
            with connection.cursor() as c:
                c.execute("RESET plan_cache_mode")

        # then the batch is claimed and marked, and each statement read about one batch
        # of rows (the claim: its batch off the index, then each row by its key), not
        # the backlog behind it
        assert len(ids) == BATCH
        assert (
            OutboxMessage.objects.filter(
                id__in=ids, processed_at__isnull=False, claimed_until__isnull=True
            ).count()
            == BATCH
        )
        assert claim_read <= 2 * BATCH + 10, (mode, claim_read)
        assert mark_read <= BATCH + 10, (mode, mark_read)

    # and the relay drains the rest of the backlog, oldest first, as before
    assert relay_drain(batch=BATCH) == BACKLOG - 2 * BATCH
    assert not OutboxMessage.objects.filter(processed_at__isnull=True).exists()
