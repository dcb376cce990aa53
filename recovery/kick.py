"""A coalesced relay kick: at most two Celery publishes per short window.

Every committed outbox row used to publish one `relay_drain` task (a kombu round trip to
Redis, ~30 % of a webhook delivery's time). One drain handles every row due when it runs,
so kicks within a short window are coalesced with two Redis `SET NX PX` keys (one Lua round trip):

- leading: the first commit of a window publishes at once (no added latency when idle);
- trailing: a commit while the leading key is held publishes once with a countdown of one
  window, so a row committed just after a drain started is still drained within a window.

Every row therefore has a drain that starts after its commit, and the beat sweep
(`recovery.relay_drain` every few seconds) stays behind it for a lost publish. Without
Redis (per-process memory cache) the same keys live in the Django cache.

Installed as the outbox's kick policy by RecoveryConfig.ready() (recovery/outbox.py imports
nothing of this module).
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.core.cache import cache

from config.redis_client import redis_client

log = logging.getLogger(__name__)

_LEADING = "relay-kick:leading"
_TRAILING = "relay-kick:trailing"


def _window_ms() -> int:
    return int(getattr(settings, "RELAY_KICK_WINDOW_MS", 500))


# One round trip: take the leading key, else the trailing key; 1, 2, or 0 (neither).
_TAKE_LUA = """
if redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1]) then return 1 end
if redis.call('SET', KEYS[2], 1, 'NX', 'PX', ARGV[1]) then return 2 end
return 0
"""
_scripts: dict[int, object] = {}


def _take(window_ms: int) -> int:
    """1: this caller took the leading key; 2: the trailing key; 0: neither."""
    client = redis_client()
    if client is not None:
        script = _scripts.get(id(client))
        if script is None:
            script = _scripts[id(client)] = client.register_script(_TAKE_LUA)
        keys = [cache.make_and_validate_key(_LEADING), cache.make_and_validate_key(_TRAILING)]
        return int(script(keys=keys, args=[window_ms]))
    timeout = max(1, window_ms // 1000)
    if cache.add(_LEADING, 1, timeout=timeout):
        return 1
    return 2 if cache.add(_TRAILING, 1, timeout=timeout) else 0


def relay_kick_coalesced(publish) -> None:
    """`publish(countdown)` at most twice per window (see the module docstring)."""
    window_ms = _window_ms()
    if window_ms <= 0:
        publish(None)
        return
    try:
        taken = _take(window_ms)
    except Exception:  # noqa: BLE001 - the cache is Redis; without it, kick every time
        log.warning("relay kick cache unavailable; kicking", exc_info=True)
        taken = 1
    if taken == 1:
        publish(None)
    elif taken == 2:
        publish(window_ms / 1000)


__all__ = ["relay_kick_coalesced"]
