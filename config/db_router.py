"""Reads from a streaming replica, only where a read path asks for it (docs/scaling.md).

With DATABASE_REPLICA_URL set, config/settings/database.py adds the `replica` alias and
installs `ReplicaRouter`. Nothing changes by that alone: every query still goes to the
primary. A read path opts in by running inside `replica_reads()`; today those are the
console's GET pages (support.web.console_view) and the /metrics scrape (recovery.views).

Why opt-in and not a router that guesses (reads → replica, writes → primary): the paths
that decide money read before they write — the idempotency record, a claim's `SELECT`,
refundable amount, a webhook's operation lookup, the reconciler's candidates, the outbox
drain — and a guessing router would send those first reads to a copy that may be seconds
behind. Here a money path cannot reach the replica unless someone wraps it on purpose,
and even inside `replica_reads()` the primary is used:
- inside any transaction on the primary (a lock, a claim, a service's atomic block);
- for the rest of the block once it has written through the ORM or opened a transaction
  (read-your-writes within a request);
- when the replica is unreachable, not in recovery, or behind by more than
  REPLICA_MAX_LAG_SECONDS (checked at most every REPLICA_LAG_CHECK_SECONDS per process).
Writes always go to the primary. Raw SQL on `django.db.connection` is always the primary.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

log = logging.getLogger(__name__)

REPLICA = "replica"

# The replica's replay lag in seconds: 0 when everything received has been replayed, else
# the age of the last replayed transaction. NULL (not a standby, or nothing received yet)
# counts as unusable. Runs on the replica: one round trip, no table read.
_LAG_SQL = """
SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END
"""


@dataclass
class _Scope:
    # Set once the block has written or opened a transaction: from then on, the primary.
    pinned: bool = False
    # Decided at the block's first read (the replica was fresh or not): one freshness
    # check per block, and a page is not read half from each copy because the cached
    # check expired half-way through.
    use_replica: bool | None = None


_scope: ContextVar[_Scope | None] = ContextVar("verity_replica_reads", default=None)


def replica_configured() -> bool:
    return REPLICA in settings.DATABASES


@contextmanager
def replica_reads():
    """Reads in this block may come from the replica (when one is configured and fresh).

    For read-only pages whose answer a person or a scraper reads, never for a path that
    decides money: a claim, an idempotency record, a refundable amount, a reconcile, a
    webhook's processing, the outbox. Nested blocks share the outer block's pin.
    """
    if _scope.get() is not None:
        yield
        return
    token = _scope.set(_Scope())
    try:
        yield
    finally:
        _scope.reset(token)


# -- replica health, cached per process --------------------------------------------------
_health_lock = threading.Lock()
_health: tuple[float, float | None] | None = None  # (checked at, lag or None = unusable)


def replica_lag_seconds(*, cached: bool = True) -> float | None:
    """The replica's replay lag, or None when it cannot serve (down, promoted, not yet
    receiving). Cached for REPLICA_LAG_CHECK_SECONDS so a busy console costs at most one
    check per interval per process."""
    global _health
    ttl = float(getattr(settings, "REPLICA_LAG_CHECK_SECONDS", 1.0))
    now = time.monotonic()
    found = _health
    if cached and ttl > 0 and found is not None and now - found[0] < ttl:
        return found[1]
    with _health_lock:
        lag: float | None
        try:
            with connections[REPLICA].cursor() as cur:
                cur.execute(_LAG_SQL)
                value = cur.fetchone()[0]
            lag = None if value is None else float(value)
        except Exception:  # noqa: BLE001 - an unreachable replica means: read the primary
            log.warning("replica unusable: reads stay on the primary", exc_info=True)
            connections[REPLICA].close()
            lag = None
        _health = (time.monotonic(), lag)
        return lag


def _replica_fresh() -> bool:
    lag = replica_lag_seconds()
    return lag is not None and lag <= float(getattr(settings, "REPLICA_MAX_LAG_SECONDS", 5.0))


def _choose() -> str:
    scope = _scope.get()
    if scope is None or scope.pinned or not replica_configured():
        return DEFAULT_DB_ALIAS
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        # A read inside a transaction belongs with the transaction's own rows and locks.
        scope.pinned = True
        return DEFAULT_DB_ALIAS
    if scope.use_replica is None:
        scope.use_replica = _replica_fresh()
    return REPLICA if scope.use_replica else DEFAULT_DB_ALIAS


class ReplicaRouter:
    """Installed only when the replica is configured (settings/database.py)."""

    def db_for_read(self, model, **hints):
        return _choose()

    def db_for_write(self, model, **hints):
        scope = _scope.get()
        if scope is not None:
            scope.pinned = True  # read-your-writes for the rest of the block
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1, obj2, **hints):
        return True  # one database, two copies of it

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return db == DEFAULT_DB_ALIAS  # the replica replays the primary's DDL
