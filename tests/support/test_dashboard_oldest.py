"""Every non-empty queue on the dashboard shows its oldest row's age, whatever database
answers the one UNION ALL count (SQLite, `make run`, returns a timestamp as text)."""

from __future__ import annotations

from datetime import UTC, datetime

from support.counts import as_datetime


def test_a_timestamp_sqlite_returns_as_text_reads_as_an_aware_datetime():
    # What `SELECT MIN(capped.age) …` returns on SQLite (seen under `make run`).
    got = as_datetime("2026-12-05 10:12:06.533499")
    assert got == datetime(2026, 12, 5, 10, 12, 6, 533499, tzinfo=UTC)
    assert as_datetime(None) is None
    same = datetime(2026, 1, 1, tzinfo=UTC)
    assert as_datetime(same) is same
