"""Concurrent reconcile read-backs after an outage (issue 18).

Real Stripe answers a read in ~100-300 ms: 10 000 unknown operations read one at a time
take half an hour. `reconcile_sweep` runs `payments.services.operation_reconcile` — the
one read-back-and-apply path, unchanged: three phases, locks, no network I/O inside a
transaction — for many operations at once on a bounded pool of threads (each with its
own database connection), under a token bucket that keeps this process's read-backs at
or below `RECONCILE_SWEEP_READS_PER_SECOND` (the provider's rate limit: Stripe allows 100
reads/s in live mode, 25 in test mode). Operations of one purchase are serialised by the
purchase lock inside the core, as they are for relay workers.

Not a set-based apply: each read-back still applies in its own transactions (~15
statements per operation); the sweep removes the wait on the provider, not those.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)


class TokenBucket:
    """At most `rate` acquisitions per second on average, bursts up to `burst`."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = float(rate)
        self.capacity = float(burst if burst is not None else max(1.0, rate))
        self._tokens = self.capacity
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        if self.rate <= 0:
            return
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.rate
            time.sleep(wait)


@dataclass
class SweepResult:
    reconciled: int = 0
    refused: int = 0          # DomainError (already settled, never dispatched): nothing read
    failed: int = 0           # unexpected errors (logged); the beat's sweep retries later
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def reconcile_sweep(*, operation_ids: Iterable[str], concurrency: int = 4,
                    reads_per_second: float | None = None,
                    actor: str = "reconciler") -> SweepResult:
    """Read back and apply every operation in `operation_ids`, `concurrency` at a time."""
    from payments.services import DomainError, operation_reconcile

    if reads_per_second is None:
        reads_per_second = float(getattr(settings, "RECONCILE_SWEEP_READS_PER_SECOND", 20))
    bucket = TokenBucket(reads_per_second)
    todo: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    ids = list(operation_ids)
    for op_id in ids:
        todo.put(op_id)
    workers = max(1, min(int(concurrency), len(ids) or 1))
    for _ in range(workers):
        todo.put(None)
    result = SweepResult()
    lock = threading.Lock()

    def work() -> None:
        try:
            while (op_id := todo.get()) is not None:
                bucket.acquire()
                try:
                    operation_reconcile(operation_id=op_id, actor=actor)
                    outcome = "reconciled"
                except DomainError:
                    outcome = "refused"
                except Exception as exc:  # noqa: BLE001 - one bad operation must not stop
                    log.warning("reconcile sweep: %s failed", op_id, exc_info=True)
                    outcome = "failed"
                    with lock:
                        result.errors.append(f"{op_id}: {type(exc).__name__}")
                with lock:
                    setattr(result, outcome, getattr(result, outcome) + 1)
        finally:
            connection.close()  # this thread's own connection

    started = time.monotonic()
    if workers == 1:
        # In the caller's thread (and connection), as a relay worker would run it.
        while (op_id := todo.get()) is not None:
            bucket.acquire()
            try:
                operation_reconcile(operation_id=op_id, actor=actor)
                result.reconciled += 1
            except DomainError:
                result.refused += 1
    else:
        threads = [threading.Thread(target=work, name=f"reconcile-sweep-{i}", daemon=True)
                   for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    result.seconds = time.monotonic() - started
    return result


__all__ = ["SweepResult", "TokenBucket", "reconcile_sweep"]
