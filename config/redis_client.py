"""The raw redis-py client behind django.core.cache's RedisCache, for the few paths that
need one Redis round trip of their own (the API rate limiter, the coalesced relay kick).
Infrastructure: it imports no app, so any layer may use it."""
from __future__ import annotations

from django.core.cache import caches

_clients: dict[int, object] = {}


def redis_client():
    """The client, or None when the default cache is not Redis. Kept per cache backend
    instance: building a redis-py client per call costs more CPU than the round trip (the
    connection pool is shared either way)."""
    default = caches["default"]  # `cache` is a proxy: its type says nothing
    if type(default).__name__ != "RedisCache":
        return None
    client = _clients.get(id(default))
    if client is None:
        client = _clients[id(default)] = default._cache.get_client(None, write=True)
    return client


def run_script(client, script, *, keys: list, args: list):
    """`script(keys=…, args=…)` (a redis-py Script: EVALSHA) on one pooled connection,
    without redis-py's per-command path (option parsing, the retry wrapper, the
    observability hooks: about a third of this call's CPU, and every API request makes
    it). Anything but a plain reply — a connection error, NOSCRIPT after a Redis restart —
    goes through `script(...)` itself, its retry and script load included, as before."""
    pool = client.connection_pool
    try:
        conn = pool.get_connection()
    except Exception:  # noqa: BLE001 - redis-py's own path decides (and raises)
        return script(keys=keys, args=args)
    try:
        conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        reply = conn.read_response()
    except Exception:  # noqa: BLE001 - as redis-py would after a failed command
        conn.disconnect()
        pool.release(conn)
        return script(keys=keys, args=args)
    pool.release(conn)
    return reply
