"""GET /metrics gives the same figures on the embedded default (SQLite, as `make run` uses
it) as on PostgreSQL, from the same stored rows. The stored webhook events' final results
are read two ways: on PostgreSQL from its table statistics (a catalog query with a
PostgreSQL-only cast), on SQLite by an exact count. The scrape's collector swallows a
failing query (a scrape never answers 500), so a broken path shows only as missing
figures: the figures themselves are compared. SQLite runs in a subprocess on a fresh
file under a temporary var/ (the embedded_sqlite fixture)."""

from __future__ import annotations

import json

import pytest

# Each value stored more than once, and far fewer values than rows: PostgreSQL's ANALYZE
# of a table it reads whole then keeps every value among its most common ones, with its
# exact frequency, so its estimate is the count.
STORED = {"applied": 40, "ignored": 20, "rejected": 10, "pending": 2, "held": 3, "quarantined": 2}
EXPECTED = {
    **{f'verity_webhook_events{{result="{r}"}}': float(n) for r, n in STORED.items()},
    "verity_webhook_held_events": 3.0,
}
PROCESS_OWN = ("_seconds", "_total", "_created")


def store_and_scrape() -> dict[str, float]:
    """Store the events, scrape /metrics as a loopback scraper and return its verity_
    figures read from the database."""
    from django.db import connection
    from django.test import Client, override_settings
    from prometheus_client.parser import text_string_to_metric_families

    from webhooks.models import ProviderEvent

    ProviderEvent.objects.bulk_create(
        ProviderEvent(
            event_id=f"evt_{result}_{i}",
            type="payment_intent.succeeded",
            payload={"id": f"evt_{result}_{i}"},
            result=result,
        )
        for result, n in STORED.items()
        for i in range(n)
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as c:  # as autovacuum's ANALYZE would
            c.execute(f"ANALYZE {ProviderEvent._meta.db_table}")
    with override_settings(METRICS_CACHE_SECONDS=0):
        answer = Client().get("/metrics")
    assert answer.status_code == 200, answer.status_code
    figures = {}
    for family in text_string_to_metric_families(answer.content.decode()):
        for sample in family.samples:
            # Ages differ by the clock; counters and their creation times are this
            # process's own (every request it served), not read from the database.
            if not sample.name.startswith("verity_") or sample.name.endswith(PROCESS_OWN):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            figures[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return figures


def _on_sqlite(embedded_sqlite) -> dict[str, float]:
    embedded_sqlite.env["ALLOWED_HOSTS"] = "testserver"
    out = embedded_sqlite.shell(
        "import json\n"
        "from django.db import connection\n"
        "from tests.recovery.test_metrics_on_both_databases import store_and_scrape\n"
        "assert connection.vendor == 'sqlite', connection.vendor\n"
        "print('FIGURES', json.dumps(store_and_scrape()))\n"
    )
    [line] = [x for x in out.splitlines() if x.startswith("FIGURES ")]
    return json.loads(line[len("FIGURES ") :])


@pytest.mark.django_db(transaction=True)
def test_metrics_give_the_same_figures_on_sqlite_and_postgresql(embedded_sqlite):
    from django.db import connection

    assert connection.vendor == "postgresql", connection.vendor
    on_postgresql = store_and_scrape()
    on_sqlite = _on_sqlite(embedded_sqlite)
    print(json.dumps({"postgresql": on_postgresql, "sqlite": on_sqlite}, indent=1))

    for name, want in EXPECTED.items():
        assert (on_postgresql.get(name), on_sqlite.get(name)) == (want, want), name
    assert on_sqlite == on_postgresql, {
        k: (on_postgresql.get(k), on_sqlite.get(k))
        for k in on_postgresql.keys() | on_sqlite.keys()
        if on_postgresql.get(k) != on_sqlite.get(k)
    }
