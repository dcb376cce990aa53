"""The console's one time format: relative ("12 min ago", "in 5 min") for reading,
absolute UTC for hover and records."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone


def span(seconds: int) -> str:
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min"
    return f"{secs} s"


def absolute(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(value: datetime, now: datetime | None = None) -> str:
    delta = int(((now or timezone.now()) - value).total_seconds())
    if abs(delta) < 5:
        return "just now"
    return f"{span(delta)} ago" if delta > 0 else f"in {span(-delta)}"
