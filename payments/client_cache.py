"""The verified ApiClient per key prefix, kept in this process for a few seconds.

Verifying an `Api-Key` costs a database query (the client by prefix) and a hash of the
secret on every request. A client verified in the last `API_CLIENT_CACHE_SECONDS` (default
5; 0 turns the cache off) is answered from memory, per process, when the presented key is
the very key verified (compared by SHA-256 digest, constant time) and the client has not
expired since.

Revocation and changes (scopes, limits) saved in *this* process take effect at once (the
save clears the cache); in other processes they take effect within the window — at most
`API_CLIENT_CACHE_SECONDS` after the change (docs/security.md): revocation, expiry,
scopes and the automatic-refund allowance. The spending limit is not affected: the hold
reserve locks and re-reads the client row (payments.locks.lock_client).
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import threading
import time

from django.conf import settings
from django.db.models.signals import post_delete, post_save

from .models import ApiClient

_lock = threading.Lock()
_verified: dict[str, tuple[bytes, ApiClient, float]] = {}  # prefix -> (digest, client, until)
_MAX_ENTRIES = 10_000


def _ttl() -> float:
    return float(getattr(settings, "API_CLIENT_CACHE_SECONDS", 5))


def api_client_verified(key: str) -> ApiClient:
    """The ApiClient for a full `prefix.secret` key, or ApiClient.DoesNotExist (unknown
    prefix, wrong secret, revoked or expired) — as `ApiClient.objects.get_from_key`."""
    ttl = _ttl()
    if ttl <= 0:
        return ApiClient.objects.get_from_key(key)
    cached = api_client_cached(key)
    if cached is not None:
        return cached
    prefix = key.partition(".")[0]
    digest = hashlib.sha256(key.encode()).digest()
    now = time.monotonic()
    client = ApiClient.objects.get_from_key(key)  # raises DoesNotExist: nothing is cached
    with _lock:
        if len(_verified) >= _MAX_ENTRIES:
            _verified.clear()
        _verified[prefix] = (digest, copy.copy(client), now + ttl)
    return client


def api_client_cached(key: str) -> ApiClient | None:
    """The client verified for this very key within the window, or None (nothing read:
    no query, no hash check beyond one SHA-256)."""
    if _ttl() <= 0:
        return None
    entry = _verified.get(key.partition(".")[0])
    if entry is None:
        return None
    known_digest, client, until = entry
    if (
        until > time.monotonic()
        and hmac.compare_digest(known_digest, hashlib.sha256(key.encode()).digest())
        and not client.has_expired
    ):
        return _own_copy(client)  # each request gets its own instance
    return None


def _own_copy(client: ApiClient) -> ApiClient:
    """`copy.copy(client)` without its pickle round (reduce, model_unpickle, the version
    check of __setstate__): the state Django's own __getstate__ copies (the instance's
    fields and its relation cache), on a new instance."""
    clone = client.__class__.__new__(client.__class__)
    clone.__dict__.update(client.__getstate__())
    return clone


def api_client_cache_clear(**_kwargs) -> None:
    with _lock:
        _verified.clear()


post_save.connect(api_client_cache_clear, sender=ApiClient, dispatch_uid="api-client-cache")
post_delete.connect(api_client_cache_clear, sender=ApiClient, dispatch_uid="api-client-cache-d")

__all__ = ["api_client_cache_clear", "api_client_cached", "api_client_verified"]
