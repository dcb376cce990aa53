"""An O(1) per-client request limiter in Redis (issue 18).

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
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from django.core.cache import cache

from config.redis_client import redis_client as _redis_client

_DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'6000/min' -> (6000, 60). The same format DRF's throttles accept."""
    num, period = rate.split("/")
    return int(num), _DURATIONS[period[0]]


@dataclass(frozen=True)
class Decision:
    allowed: bool
    wait_seconds: float  # until the window ends (meaningful when refused)


def rate_limit_hit(*, ident: str, limit: int, window_seconds: int) -> Decision:
    """Count one request against `ident`'s window; allowed while the count ≤ limit."""
    key = cache.make_and_validate_key(f"rl:{ident}")
    client = _redis_client()
    if client is not None:
        pipe = client.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, window_seconds, nx=True)
        pipe.pttl(key)
        count, _, pttl = pipe.execute()
        left = pttl / 1000 if pttl and pttl > 0 else window_seconds
    else:  # per-process memory cache: not shared, good enough for one dev process
        started = f"rl:{ident}:t"
        if cache.add(f"rl:{ident}", 0, timeout=window_seconds):
            cache.set(started, time.monotonic(), timeout=window_seconds)
        count = cache.incr(f"rl:{ident}")
        begun = cache.get(started) or time.monotonic()
        left = max(0.0, window_seconds - (time.monotonic() - begun))
    return Decision(allowed=count <= limit, wait_seconds=max(1, math.ceil(left)))


# x402 settle attempts per API client (issue 31 #3): a bucket of its own, so the general
# API throttle's window and this one never share a count.
X402_SETTLE_BUCKET = "x402-settle"


def x402_settle_hit(*, client_id, rate: str) -> Decision:
    """Count one x402 settle attempt of this API client against `rate` ('30/min')."""
    limit, window = parse_rate(rate)
    return rate_limit_hit(ident=f"{X402_SETTLE_BUCKET}:client:{client_id}", limit=limit,
                          window_seconds=window)


__all__ = ["Decision", "X402_SETTLE_BUCKET", "parse_rate", "rate_limit_hit",
           "x402_settle_hit"]
