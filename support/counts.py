"""Capped counts and "oldest" for the console's landing page (issue 18).

A queue's exact length is not what a landing page needs once it is long: counting 20 000
rows at 1 M purchases costs seconds. `capped_count` counts at most `COUNT_CAP + 1` rows
(`SELECT count(*) FROM (… LIMIT 1001)`), shown as "1 000+"; `oldest` is one row by
`ORDER BY field LIMIT 1` on the queue's index instead of `MIN()` over every row. The
queue pages themselves still list the rows, oldest first.
"""
from __future__ import annotations

from datetime import datetime

COUNT_CAP = 1000


def capped_count(qs) -> int:
    """len(qs), or COUNT_CAP + 1 if there are more than COUNT_CAP rows."""
    return qs.order_by().values("pk")[:COUNT_CAP + 1].count()


def oldest(qs, field_name: str) -> datetime | None:
    """min(field) over qs by one indexed ORDER BY … LIMIT 1 (NULLs ignored, like MIN)."""
    return (qs.filter(**{f"{field_name}__isnull": False}).order_by(field_name)
            .values_list(field_name, flat=True).first())


def count_label(n: int) -> str:
    """'1 000+' past the cap, else the number (thin-space thousands, as the console)."""
    if n > COUNT_CAP:
        return f"{COUNT_CAP:,}+".replace(",", " ")
    return str(n)


__all__ = ["COUNT_CAP", "capped_count", "count_label", "oldest"]
