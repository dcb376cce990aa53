"""Attack on af921b0 (config.redis_client.run_script): the limiter's EVALSHA on a pooled
connection falls back to redis-py's Script call on *any* exception, including a read
that timed out after Redis had already run the script. Real Redis, no fakes: another
connection keeps Redis busy (a Lua busy loop) longer than the cache's socket_timeout (1 s),
so the limiter's EVALSHA is queued, its read times out, and the fallback sends it again.
Both run: one request is counted twice (the counter in Redis says so)."""
import threading
import time

import pytest
import redis
from django.conf import settings
from django.core.cache import cache

from config.redis_client import redis_client
from payments.api.ratelimit import _SCRIPT, rate_limit_hit

pytestmark = pytest.mark.django_db

_BUSY = """
local t = redis.call('TIME')
while true do
  local n = redis.call('TIME')
  if (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > tonumber(ARGV[1]) then break end
end
return 1
"""


def _busy_redis(micros: int) -> threading.Thread:
    other = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"], socket_timeout=10)
    thread = threading.Thread(target=lambda: other.eval(_BUSY, 0, micros), daemon=True)
    thread.start()
    time.sleep(0.1)  # the busy script is running: every other command queues behind it
    return thread


def _count(ident: str) -> int:
    return int(redis_client().get(cache.make_key(f"rl:{ident}")) or 0)


def test_one_request_is_counted_once_when_redis_answers_late():
    client = redis_client()
    assert client is not None
    ident = f"attack-late:{time.time_ns()}"
    rate_limit_hit(ident=ident, limit=100, window_seconds=60)  # script loaded, warm pool
    assert _count(ident) == 1

    busy = _busy_redis(1_500_000)  # 1.5 s > socket_timeout (1 s)
    try:
        rate_limit_hit(ident=ident, limit=100, window_seconds=60)
    except Exception:  # noqa: BLE001 - a refused/failed call may raise; the count judges
        pass
    busy.join(5)

    assert _count(ident) == 2, "one request counted more than once (or not at all)"


def test_redis_py_script_alone_under_the_same_stall():
    """Control: the pre-af921b0 path (redis-py's Script call only), same stall."""
    client = redis_client()
    ident = f"attack-late-control:{time.time_ns()}"
    script = client.register_script(_SCRIPT)
    keys = [cache.make_key(f"rl:{ident}")]
    script(keys=keys, args=[60])
    busy = _busy_redis(1_500_000)
    try:
        script(keys=keys, args=[60])
    except Exception:  # noqa: BLE001
        pass
    busy.join(5)
    print("control count", _count(ident))
    assert _count(ident) == 2


def test_lockout_holds_after_script_flush():
    """A prefix at its failure limit is refused without counting, also right after
    SCRIPT FLUSH (NOSCRIPT goes through redis-py's load)."""
    client = redis_client()
    ident = f"attack-flush:{time.time_ns()}"
    cache.set("api-auth-fail:prefix:attack", 5, timeout=60)
    client.script_flush()
    locked = rate_limit_hit(ident=ident, limit=10, window_seconds=60,
                            lock_keys=[("api-auth-fail:prefix:attack", 5)])
    assert (locked.allowed, locked.locked) == (False, True)
    assert _count(ident) == 0
    client.script_flush()
    free = rate_limit_hit(ident=ident, limit=10, window_seconds=60)
    assert free.allowed and _count(ident) == 1
