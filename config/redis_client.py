"""The raw redis-py client behind django.core.cache's RedisCache, for the few paths that
need one Redis round trip of their own (the API rate limiter, the coalesced relay kick).
Infrastructure: it imports no app, so any layer may use it."""

from __future__ import annotations

import sys
from typing import Any

from django.core.cache import caches
from redis.exceptions import NoScriptError

_clients: dict[int, Any] = {}


def redis_client() -> Any:
    """The client, or None when the default cache is not Redis. Kept per cache backend
    instance: building a redis-py client per call costs more CPU than the round trip (the
    connection pool is shared either way)."""
    default = caches["default"]  # `cache` is a proxy: its type says nothing
    if type(default).__name__ != "RedisCache":
        return None
    client = _clients.get(id(default))
    if client is None:
        # RedisCache keeps its client holder in `_cache`, which the stubs do not declare.
        holder = default._cache  # type: ignore[attr-defined]
        client = _clients[id(default)] = holder.get_client(None, write=True)
    return client


class PendingScript:
    """A script sent on a pooled connection held until its reply is read (`reply()`,
    once): the caller does other I/O meanwhile — the API fast path reads PostgreSQL — so
    both round trips overlap and the process sleeps once, not twice."""

    __slots__ = ("_client", "_script", "_keys", "_args", "_conn", "_reply", "_read", "_error")

    def __init__(self, client, script, keys: list, args: list) -> None:
        self._client, self._script, self._keys, self._args = client, script, keys, args
        self._conn = self._reply = self._error = None
        self._read = False
        pool = client.connection_pool
        try:
            conn = pool.get_connection()
        except Exception:  # noqa: BLE001 - redis-py's own path decides (and raises)
            return
        try:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except Exception:  # noqa: BLE001 - as redis-py would after a failed command
            conn.disconnect()
            pool.release(conn)
            return
        self._conn = conn

    def reply(self):
        if self._error is not None:
            raise self._error
        if self._read:
            return self._reply
        conn, self._conn = self._conn, None
        self._read = True
        if conn is None:  # not sent: redis-py's own path, its retry included
            self._reply = self._script(keys=self._keys, args=self._args)
            return self._reply
        pool = self._client.connection_pool
        try:
            reply = conn.read_response()
        except NoScriptError:
            # Redis lost its scripts (a restart, SCRIPT FLUSH) and ran nothing: redis-py's
            # path loads the script and runs it once. The error reply was read: the
            # connection is in step.
            pool.release(conn)
            self._reply = self._script(keys=self._keys, args=self._args)
            return self._reply
        except BaseException:
            # A timeout or a lost connection after the command was sent: Redis may have
            # run it (it answers late), so it is never sent again — the caller decides
            # (the limiter fails open, counted at most once). The connection may hold an
            # unread reply: dropped, not reused.
            conn.disconnect()
            pool.release(conn)
            self._error = sys.exc_info()[1]
            raise
        pool.release(conn)
        self._reply = reply
        return reply


def send_script(client, script, *, keys: list, args: list) -> PendingScript:
    """`run_script` in two halves: EVALSHA is sent now, its reply read by `.reply()`.
    Call `.reply()` on every path (a `finally`): the connection is held until then."""
    return PendingScript(client, script, keys, args)


def run_script(client, script, *, keys: list, args: list):
    """`script(keys=…, args=…)` (a redis-py Script: EVALSHA) on one pooled connection,
    without redis-py's per-command path (option parsing, the retry wrapper, the
    observability hooks: about a third of this call's CPU, and every API request makes
    it). A command that could not be sent, or that Redis refused with NOSCRIPT (a restart,
    SCRIPT FLUSH: nothing ran), goes through `script(...)` itself, its retry and script
    load included. A failure after the command was sent (a timeout: Redis may still run
    it) raises instead of sending it again: one call, at most one effect."""
    return send_script(client, script, keys=keys, args=args).reply()
