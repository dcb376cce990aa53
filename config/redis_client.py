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
