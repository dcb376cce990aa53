"""An O(1) per-client request limiter in Redis.

DRF's `SimpleRateThrottle` keeps every request time of the window in one cache value: each
request GETs it, unpickles it, trims it, appends and SETs it back — O(requests in the
window) per request, and two round trips. This is a fixed window started by the first
request of the window: one pipelined round trip of

    INCR key; EXPIRE key <window> NX; PTTL key

(`NX`: only the first request of a window sets the expiry, so the window is anchored at
that request, not at a clock boundary). Past the limit the answer is the same 429
`rate_limited` with `Retry-After` = the time left in the window. A fixed window lets a
client send up to twice the rate across a window boundary; for a generous per-client
ceiling that is the accepted trade-off for O(1).

Without Redis (`make run` with the per-process memory cache) the same counter is kept in
the Django cache (`add` + `incr`), good enough for one process.

The failed-authentication lockout counters (payments.api.authentication) are read in
the same round trip, by one Lua script (`_SCRIPT`): a locked request is not counted against
the limit (as before, when the lockout refused it before the throttle ran), and an allowed
one costs one Redis round trip in all instead of two (plus a client built per call by
Django's cache for the lockout read).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.core.cache import cache

from config.redis_client import redis_client as _redis_client
from config.redis_client import send_script

_DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'6000/min' -> (6000, 60). The same format DRF's throttles accept."""
    num, period = rate.split("/")
    return int(num), _DURATIONS[period[0]]


@dataclass(frozen=True)
class Decision:
    allowed: bool
    wait_seconds: float  # until the window ends (meaningful when refused)
    locked: bool = False  # a lockout counter was at its limit: nothing was counted


# KEYS[1] the limiter's counter, KEYS[2..] lockout counters; ARGV[1] the window (s),
# ARGV[2..] each lockout counter's limit. -> {count, pttl}, or {-1, 0} when locked out.
# Lockout counters are Django cache integers (stored raw by RedisSerializer).
_SCRIPT = """
for i = 2, #KEYS do
  local v = tonumber(redis.call('GET', KEYS[i]) or '0')
  if v ~= nil and v >= tonumber(ARGV[i]) then return {-1, 0} end
end
local c = redis.call('INCR', KEYS[1])
local t = redis.call('PTTL', KEYS[1])
if t < 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
  t = tonumber(ARGV[1]) * 1000
end
return {c, t}
"""
_scripts: dict[int, object] = {}


def _script(client):
    # register_script: EVALSHA, loading the script again after a Redis restart (NOSCRIPT).
    script = _scripts.get(id(client))
    if script is None:
        script = _scripts[id(client)] = client.register_script(_SCRIPT)
    return script


def lockout_locked(lock_keys: list[tuple[str, int]]) -> bool:
    """Whether any lockout counter (Django cache key, limit) is at its limit."""
    counts = cache.get_many([k for k, _ in lock_keys])
    return any(counts.get(k, 0) >= limit for k, limit in lock_keys)


class PendingDecision:
    """A limiter hit sent to Redis, its answer read by `decision()` (once; later calls
    give the same Decision). Without Redis the hit is counted at once."""

    __slots__ = ("_pending", "_limit", "_window", "_decision")

    def __init__(
        self, *, pending=None, limit: int = 0, window: int = 0, decision: Decision | None = None
    ) -> None:
        self._pending, self._limit, self._window = pending, limit, window
        self._decision = decision

    def decision(self) -> Decision:
        if self._decision is None:
            count, pttl = self._pending.reply()
            if count < 0:
                self._decision = Decision(allowed=False, wait_seconds=0, locked=True)
            else:
                left = pttl / 1000 if pttl and pttl > 0 else self._window
                self._decision = Decision(
                    allowed=count <= self._limit, wait_seconds=max(1, math.ceil(left))
                )
        return self._decision


def rate_limit_send(
    *, ident: str, limit: int, window_seconds: int, lock_keys: Sequence[tuple[str, int]] = ()
) -> PendingDecision:
    """`rate_limit_hit` with its Redis round trip left open: the hit is sent now and
    `.decision()` reads the answer, so the caller can overlap it with a database read.
    Call `.decision()` on every path (the pooled connection is held until then)."""
    client = _redis_client()
    if client is None:
        return PendingDecision(decision=_memory_hit(ident, limit, window_seconds, lock_keys))
    # make_key: the very key make_and_validate_key gives (the lockout counters are
    # written through it), without its per-character scan, which only warns about
    # keys memcached would refuse; this cache is Redis.
    keys = [cache.make_key(f"rl:{ident}"), *(cache.make_key(k) for k, _ in lock_keys)]
    pending = send_script(
        client, _script(client), keys=keys, args=[window_seconds, *(n for _, n in lock_keys)]
    )
    return PendingDecision(pending=pending, limit=limit, window=window_seconds)


def rate_limit_hit(
    *, ident: str, limit: int, window_seconds: int, lock_keys: Sequence[tuple[str, int]] = ()
) -> Decision:
    """Count one request against `ident`'s window; allowed while the count ≤ limit.

    `lock_keys` (Django cache key, limit): when one is at its limit the answer is
    `locked` and nothing is counted — read in the same Redis round trip."""
    return rate_limit_send(
        ident=ident, limit=limit, window_seconds=window_seconds, lock_keys=lock_keys
    ).decision()


def _memory_hit(
    ident: str, limit: int, window_seconds: int, lock_keys: Sequence[tuple[str, int]]
) -> Decision:
    # The per-process memory cache (`make run` without Redis): not shared, good enough
    # for one development process.
    if lock_keys and lockout_locked(list(lock_keys)):
        return Decision(allowed=False, wait_seconds=0, locked=True)
    started = f"rl:{ident}:t"
    if cache.add(f"rl:{ident}", 0, timeout=window_seconds):
        cache.set(started, time.monotonic(), timeout=window_seconds)
    count = cache.incr(f"rl:{ident}")
    begun = cache.get(started) or time.monotonic()
    left = max(0.0, window_seconds - (time.monotonic() - begun))
    return Decision(allowed=count <= limit, wait_seconds=max(1, math.ceil(left)))


# x402 settle attempts per API client: a bucket of its own, so the general
# API throttle's window and this one never share a count.
X402_SETTLE_BUCKET = "x402-settle"


def x402_settle_hit(*, client_id, rate: str) -> Decision:
    """Count one x402 settle attempt of this API client against `rate` ('30/min')."""
    limit, window = parse_rate(rate)
    return rate_limit_hit(
        ident=f"{X402_SETTLE_BUCKET}:client:{client_id}", limit=limit, window_seconds=window
    )


__all__ = [
    "Decision",
    "PendingDecision",
    "X402_SETTLE_BUCKET",
    "lockout_locked",
    "parse_rate",
    "rate_limit_hit",
    "rate_limit_send",
    "x402_settle_hit",
]
