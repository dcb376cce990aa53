"""A coalesced relay kick (issue 18): at most two Celery publishes per short window.

Every committed outbox row used to publish one `relay_drain` task (a kombu round trip to
Redis, ~30 % of a webhook delivery's time). One drain handles every row due when it runs,
so kicks within a short window are coalesced with two Redis `SET NX PX` keys:

- leading: the first commit of a window publishes at once (no added latency when idle);
- trailing: a commit while the leading key is held publishes once with a countdown of one
  window, so a row committed just after a drain started is still drained within a window.

Every row therefore has a drain that starts after its commit, and the beat sweep
(`recovery.relay_drain` every few seconds) stays behind it for a lost publish. Without
Redis (per-process memory cache) the same keys live in the Django cache.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)

_LEADING = "relay-kick:leading"
_TRAILING = "relay-kick:trailing"


def _window_ms() -> int:
    return int(getattr(settings, "RELAY_KICK_WINDOW_MS", 500))


def _take(name: str, window_ms: int) -> bool:
    """SET name NX PX window: True if this caller took the key."""
    from payments.ratelimit import _redis_client

    client = _redis_client()
    if client is not None:
        return bool(client.set(cache.make_and_validate_key(name), 1, nx=True, px=window_ms))
    return cache.add(name, 1, timeout=max(1, window_ms // 1000))


def relay_kick_coalesced(publish) -> None:
    """`publish(countdown)` at most twice per window (see the module docstring)."""
    window_ms = _window_ms()
    if window_ms <= 0:
        publish(None)
        return
    try:
        if _take(_LEADING, window_ms):
            publish(None)
        elif _take(_TRAILING, window_ms):
            publish(window_ms / 1000)
    except Exception:  # noqa: BLE001 - the cache is Redis; without it, kick every time
        log.warning("relay kick cache unavailable; kicking", exc_info=True)
        publish(None)


__all__ = ["relay_kick_coalesced"]
