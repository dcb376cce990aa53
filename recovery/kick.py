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

A commit that finds the trailing key held is covered by that key's drain, which starts when
the key expires or later (it was published with a countdown of the key's lifetime). The
script returns how long that is (PTTL), and the process remembers it: until then its
commits need no Redis round trip at all (a drain already starts after each of them). Under
a steady stream that is a few round trips per window per process instead of one per commit
(the round trip was ~0.25 ms of a ~1.1 ms webhook delivery).

Installed as the outbox's kick policy by RecoveryConfig.ready() (recovery/outbox.py imports
nothing of this module). Another task that handles everything due when it runs (the
storefront webhooks' `events.deliver_due`) coalesces its kicks the same way under its own
`name` (its own keys and coverage).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache

from config.redis_client import redis_client, run_script

log = logging.getLogger(__name__)

_RELAY = "relay-kick"


def _window_ms() -> int:
    return int(getattr(settings, "RELAY_KICK_WINDOW_MS", 500))


# One round trip: take the leading key, else the trailing key, else say how long the
# trailing key (and so the drain its holder published) has left: {1, 0}, {2, 0} or {0, ms}.
_TAKE_LUA = """
if redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1]) then return {1, 0} end
if redis.call('SET', KEYS[2], 1, 'NX', 'PX', ARGV[1]) then return {2, 0} end
return {0, redis.call('PTTL', KEYS[2])}
"""
_scripts: dict[int, object] = {}
# Per name: this process's commits until this time.monotonic() are covered by a drain
# already published to start later (a trailing kick, ours or another process's). Plain
# floats: under threads a lost update costs one extra round trip, never a missed drain.
_covered_until: dict[str, float] = {}
# Coverage is cut short by this much: the drain's countdown is counted from the publish
# on the publisher's clock and ends on the worker's (hosts kept in step by NTP). Commits in
# this last stretch of a trailing key's life each ask Redis, as before.
_MARGIN_S = 0.01


def _take(window_ms: int, name: str = _RELAY) -> tuple[int, int]:
    """(1, 0): this caller took the leading key; (2, 0): the trailing key; (0, ms): neither,
    and the trailing key expires in ms (0 when unknown)."""
    leading, trailing = f"{name}:leading", f"{name}:trailing"
    client = redis_client()
    if client is not None:
        script = _scripts.get(id(client))
        if script is None:
            script = _scripts[id(client)] = client.register_script(_TAKE_LUA)
        keys = [cache.make_and_validate_key(leading), cache.make_and_validate_key(trailing)]
        taken, ttl_ms = run_script(client, script, keys=keys, args=[window_ms])
        return int(taken), max(0, int(ttl_ms))
    timeout = max(1, window_ms // 1000)
    if cache.add(leading, 1, timeout=timeout):
        return 1, 0
    return (2, 0) if cache.add(trailing, 1, timeout=timeout) else (0, 0)


def relay_kick_coalesced(publish: Callable[[float | None], object], *, name: str = _RELAY) -> None:
    """`publish(countdown)` at most twice per window (see the module docstring)."""
    window_ms = _window_ms()
    if window_ms <= 0:
        publish(None)
        return
    now = time.monotonic()
    if now < _covered_until.get(name, 0.0):
        return  # a drain already published starts after this commit
    try:
        taken, ttl_ms = _take(window_ms, name)
    except Exception:  # noqa: BLE001 - the cache is Redis; without it, kick every time
        log.warning("relay kick cache unavailable; kicking", exc_info=True)
        taken, ttl_ms = 1, 0
    if taken == 1:
        publish(None)
        return
    if taken == 2:
        # Covered from the moment of the publish: a failed publish (broker down) covers
        # nothing, and the beat sweep is behind it as for every lost kick.
        publish(window_ms / 1000)
        ttl_ms = window_ms
    if ttl_ms:
        _covered_until[name] = now + ttl_ms / 1000 - _MARGIN_S


def relay_kick_forget() -> None:
    """Forget this process's coverage (a test that empties the broker: the drain it
    remembered is gone with it), under every name."""
    _covered_until.clear()


__all__ = ["relay_kick_coalesced", "relay_kick_forget"]
