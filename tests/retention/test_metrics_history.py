"""A /metrics scrape costs the same with a large stored history as with none.

With 5 M stored webhook events one collection took 7.6 s (docs/retention.md): the gauges
counted every event. The effect measured here is what each scrape statement reads from the
history table (PostgreSQL's own EXPLAIN ANALYZE row counts), with few and with many
processed events: the waiting events only, however many processed ones there are.
"""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from webhooks.models import EventResult, ProviderEvent

pytestmark = pytest.mark.django_db

TABLE = ProviderEvent._meta.db_table


def _events(n: int, *, tag: str, result=EventResult.APPLIED) -> None:
    ProviderEvent.objects.bulk_create(
        [
            ProviderEvent(
                event_id=f"evt_{tag}_{i}",
                type="payment_intent.succeeded",
                payload={"id": f"evt_{tag}_{i}"},
                result=result,
            )
            for i in range(n)
        ],
        batch_size=2000,
    )


def _rows_read(sql: str, table: str) -> int:
    """Rows the statement's scans of `table` looked at (returned plus filtered out)."""
    with connection.cursor() as c:
        c.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        plan = c.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    total, nodes = 0, [plan[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if node.get("Relation Name") == table:
            looked = (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
            total += looked * node.get("Actual Loops", 1)
    return total


def _scrape(client):
    with CaptureQueriesContext(connection) as queries:
        answer = client.get("/metrics")
    assert answer.status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    return (
        answer,
        sql,
        sum(
            _rows_read(s, TABLE)
            for s in sql
            if TABLE in s and s.lstrip().upper().startswith("SELECT")
        ),
    )


def _sample(answer, result: str) -> float:
    prefix = f'verity_webhook_events{{result="{result}"}} '
    line = next(x for x in answer.content.decode().splitlines() if x.startswith(prefix))
    return float(line[len(prefix) :])


def test_a_scrape_reads_the_waiting_events_only_however_many_are_stored(client, settings):
    if connection.vendor != "postgresql":
        pytest.skip("the cost measured is PostgreSQL's plan")
    settings.METRICS_CACHE_SECONDS = 0
    # (the waiting-events gauges read webhooks' providerevent_waiting_idx)
    # given a few events waiting (held, quarantined) and a few processed ones
    _events(3, tag="held", result=EventResult.HELD)
    _events(2, tag="quar", result=EventResult.QUARANTINED)
    _events(5, tag="few")
    with connection.cursor() as c:
        c.execute(f"ANALYZE {TABLE}")
    _, small_sql, _ = _scrape(client)

    # and then many more processed events (history), statistics refreshed as autovacuum
    # would
    _events(6000, tag="many")
    with connection.cursor() as c:
        c.execute(f"ANALYZE {TABLE}")

    # when scraped again
    answer, large_sql, read = _scrape(client)

    # then the same statements, reading the 5 waiting events (not the 6 005 processed)
    assert len(large_sql) == len(small_sql)
    assert read <= 10, read
    # and the figures: waiting ones exact, the processed total the planner's estimate
    assert (
        _sample(answer, "held"),
        _sample(answer, "quarantined"),
        _sample(answer, "pending"),
    ) == (3, 2, 0)
    assert b"verity_webhook_held_events 3.0" in answer.content
    assert 5400 <= _sample(answer, "applied") <= 6600
