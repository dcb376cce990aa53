"""Waiting for a condition with a deadline."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1):
    """Poll a condition with a deadline (tests never sleep for a fixed long time)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
