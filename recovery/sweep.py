"""Concurrent, set-based reconcile read-backs after an outage.

Real Stripe answers a read in ~100-300 ms: 10 000 unknown operations read one at a time
take half an hour. `reconcile_sweep` takes the operations in batches and, per batch, runs
the three steps of `payments.services`' set-based reconcile: one read of the batch
(`operations_reconcile_prepare`), the provider read-backs on a bounded pool of threads
(`operation_reconcile_read`: network only, no database, no transaction) under a token
bucket that keeps this process's read-backs at or below
`RECONCILE_SWEEP_READS_PER_SECOND` (the provider's rate limit: Stripe allows 100 reads/s
in live mode, 25 in test mode), then the apply of the whole batch in one transaction with
bulk writes (`operations_reconcile_apply`: the same apply path, locks and effects as
`operation_reconcile`, ~4 statements per operation instead of ~16). The read-backs of
the next batch run while the current one is applied. Operations of one purchase are
serialised by the purchase lock, as they are for relay workers; x402 read-backs read the
database, so they go through `operation_reconcile` one by one in the caller's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from payments.models import PaymentOperation, ProviderCall
    from payments.providers.base import CallResult

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
    refused: int = 0  # DomainError (already settled, never dispatched): nothing read
    failed: int = 0  # unexpected errors (logged); the beat's sweep retries later
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def reconcile_sweep(
    *,
    operation_ids: Iterable[str],
    concurrency: int = 4,
    reads_per_second: float | None = None,
    actor: str = "reconciler",
    batch_size: int | None = None,
) -> SweepResult:
    """Read back and apply every operation in `operation_ids`, `concurrency` read-backs
    at a time, applied `batch_size` at a time (RECONCILE_SWEEP_BATCH_SIZE)."""
    from payments.services import (
        DomainError,
        operation_reconcile,
        operation_reconcile_read,
        operations_reconcile_apply,
        operations_reconcile_prepare,
    )

    if reads_per_second is None:
        reads_per_second = float(getattr(settings, "RECONCILE_SWEEP_READS_PER_SECOND", 20))
    if batch_size is None:
        batch_size = int(getattr(settings, "RECONCILE_SWEEP_BATCH_SIZE", 50))
    batch_size = max(1, batch_size)
    bucket = TokenBucket(reads_per_second)
    ids = list(dict.fromkeys(operation_ids))  # each operation once
    result = SweepResult()

    def read(op: PaymentOperation) -> tuple[CallResult, ProviderCall]:
        bucket.acquire()
        return operation_reconcile_read(op)

    def count(outcomes: dict[str, str]) -> None:
        for op_id, outcome in outcomes.items():
            if outcome.startswith("failed"):
                result.failed += 1
                result.errors.append(f"{op_id}: {outcome.partition(':')[2]}")
            else:
                setattr(result, outcome, getattr(result, outcome) + 1)

    def apply(
        ops: list[PaymentOperation], futures: list[Future[tuple[CallResult, ProviderCall]]]
    ) -> None:
        reads: list[tuple[PaymentOperation, CallResult, ProviderCall]] = []
        outcomes: dict[str, str] = {}
        for op, future in zip(ops, futures, strict=False):
            try:
                call_result, call = future.result()
            except Exception as exc:  # noqa: BLE001 - one bad operation must not stop
                log.warning("reconcile sweep: %s read failed", op.id, exc_info=True)
                outcomes[op.id] = f"failed:{type(exc).__name__}"
                continue
            reads.append((op, call_result, call))
        outcomes.update(operations_reconcile_apply(reads=reads, actor=actor))
        count(outcomes)

    started = time.monotonic()
    workers = max(1, min(int(concurrency), len(ids) or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile-sweep") as pool:
        pending = None
        for start in range(0, len(ids), batch_size):
            readable, sequential, refused = operations_reconcile_prepare(
                operation_ids=ids[start : start + batch_size]
            )
            result.refused += len(refused)
            futures = [pool.submit(read, op) for op in readable]
            if pending is not None:
                apply(*pending)  # while this batch's read-backs run
            pending = (readable, futures)
            for op in sequential:
                bucket.acquire()
                try:
                    operation_reconcile(operation_id=op.id, actor=actor)
                    result.reconciled += 1
                except DomainError:
                    result.refused += 1
                except Exception as exc:  # noqa: BLE001
                    log.warning("reconcile sweep: %s failed", op.id, exc_info=True)
                    result.failed += 1
                    result.errors.append(f"{op.id}: {type(exc).__name__}")
        if pending is not None:
            apply(*pending)
    result.seconds = time.monotonic() - started
    return result


__all__ = ["SweepResult", "TokenBucket", "reconcile_sweep"]
