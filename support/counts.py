"""Capped counts and "oldest" for the console's landing page.

A queue's exact length is not what a landing page needs once it is long: counting 20 000
rows at 1 M purchases costs seconds. `capped_count` counts at most `COUNT_CAP + 1` rows
(`SELECT count(*) FROM (… LIMIT 1001)`), shown as "1 000+"; the oldest comes from the
same statement, the capped rows being read in the order of the field (the queue's index),
instead of `MIN()` over every row; `capped_counts_oldest` puts every queue's capped count in
one UNION ALL, so the landing page makes one round trip for all of them. The queue pages
themselves still list the rows, oldest first.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.models import F, QuerySet
from django.utils.dateparse import parse_datetime

COUNT_CAP = 1000


def capped_count(qs) -> int:
    """len(qs), or COUNT_CAP + 1 if there are more than COUNT_CAP rows."""
    return qs.order_by().values("pk")[: COUNT_CAP + 1].count()


def oldest(qs, field_name: str) -> datetime | None:
    """min(field) over qs by one indexed ORDER BY … LIMIT 1 (NULLs ignored, like MIN)."""
    return (
        qs.filter(**{f"{field_name}__isnull": False})
        .order_by(field_name)
        .values_list(field_name, flat=True)
        .first()
    )


def capped_count_oldest(qs, field_name: str) -> tuple[int, datetime | None]:
    """(capped count, min(field)) in ONE statement: `SELECT count(*), min(f) FROM (SELECT …
    ORDER BY f NULLS LAST LIMIT 1001)`. Ordered by the field, the capped rows start with
    the oldest, so the minimum over them is the minimum over the whole queue."""
    from django.db.models import Count, Min

    capped = qs.order_by(F(field_name).asc(nulls_last=True))[: COUNT_CAP + 1]
    r = capped.aggregate(n=Count("pk"), oldest=Min(field_name))
    return r["n"], r["oldest"]


def capped_counts_oldest(counted: list[tuple[QuerySet, str]]) -> list[tuple[int, datetime | None]]:
    """`capped_count_oldest` of several (query set, field) pairs in ONE statement: each
    pair's capped subquery becomes one branch of a UNION ALL (planned on its own, as the
    separate statement was), so a landing page with fifteen queues makes one round trip.
    Every pair must be on the same database."""
    if not counted:
        return []
    using = {qs.db for qs, _ in counted}
    if len(using) != 1:
        raise ValueError(f"capped counts span databases {sorted(using)}")
    branches: list[str] = []
    params: list[Any] = []
    for i, (qs, field_name) in enumerate(counted):
        if qs.query.distinct:
            # values() below would make DISTINCT apply to the age field alone.
            raise ValueError("a DISTINCT query set cannot be counted by its age field; use EXISTS")
        capped = qs.order_by(F(field_name).asc(nulls_last=True)).values(age=F(field_name))[
            : COUNT_CAP + 1
        ]
        sql, branch_params = capped.query.sql_with_params()
        branches.append(
            f"SELECT {i} AS part, COUNT(*) AS n, MIN(capped.age) AS oldest FROM ({sql}) capped"
        )
        params.extend(branch_params)
    with connections[using.pop()].cursor() as cursor:
        cursor.execute(" UNION ALL ".join(branches), params)
        found = {part: (n, as_datetime(oldest)) for part, n, oldest in cursor.fetchall()}
    return [found[i] for i in range(len(counted))]


def as_datetime(value) -> datetime | None:
    """A raw cursor's timestamp as an aware datetime. PostgreSQL's driver returns one;
    SQLite (`make run`) returns the stored text, which the dashboard could not show (every
    queue counted in the UNION read "Oldest —")."""
    if value is None or isinstance(value, datetime):
        return value
    parsed = parse_datetime(str(value))
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # Django stores UTC (USE_TZ)
    return parsed


def count_label(n: int) -> str:
    """'1 000+' past the cap, else the number (thin-space thousands, as the console)."""
    if n > COUNT_CAP:
        return f"{COUNT_CAP:,}+".replace(",", " ")
    return str(n)


__all__ = [
    "COUNT_CAP",
    "capped_count",
    "capped_count_oldest",
    "capped_counts_oldest",
    "count_label",
    "oldest",
    "as_datetime",
]
