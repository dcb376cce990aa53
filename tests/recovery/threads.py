"""Threads released together, as concurrent workers or requests are."""

from __future__ import annotations

import threading

from django.db import connection


def run_concurrently(fn, n: int) -> list:
    """Run fn() in n threads released together; each thread closes its DB connection."""
    barrier = threading.Barrier(n)
    results, errors = [], []

    def target():
        try:
            barrier.wait(10)
            results.append(fn())
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results
