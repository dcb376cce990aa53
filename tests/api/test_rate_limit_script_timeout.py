"""The limiter's EVALSHA on a pooled
connection falls back to redis-py's Script call on *any* exception, including a read
that timed out after Redis had already run the script. Real Redis, no fakes: another
connection keeps Redis busy (a Lua busy loop) longer than the cache's socket_timeout (1 s),
so the limiter's EVALSHA is queued, its read times out, and the fallback sends it again.
Both run: one request is counted twice (the counter in Redis says so).

Found failing (both fixed): test_one_request_is_counted_once_when_redis_answers_late,
test_one_api_request_is_counted_once_when_redis_answers_late[*] (af921b0: the fallback
now runs only when nothing was sent or Redis answered NOSCRIPT), and
test_old_script_path_one_api_request_counted_once[fast-path] (the fast path's swallowed
exception, independent of af921b0: it now leaves a fail-open decision for the view).
Controls: the redis-py Script path alone counts once (unit and drf-only)."""

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
    locked = rate_limit_hit(
        ident=ident, limit=10, window_seconds=60, lock_keys=[("api-auth-fail:prefix:attack", 5)]
    )
    assert (locked.allowed, locked.locked) == (False, True)
    assert _count(ident) == 0
    client.script_flush()
    free = rate_limit_hit(ident=ident, limit=10, window_seconds=60)
    assert free.allowed and _count(ident) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "stall_us, fast", [(1_500_000, True), (1_500_000, False), (2_500_000, True)]
)
def test_one_api_request_is_counted_once_when_redis_answers_late(
    storefront, product, settings, stall_us, fast
):
    """End to end: one GET /purchases/{id} (fast path, or DRF alone via a query string)
    while Redis answers after the socket timeout. The client's counter must rise by one."""
    from payments.api.authentication import ApiClientRateThrottle

    settings.API_CLIENT_CACHE_SECONDS = 60
    settings.API_FAST_PATH = True
    purchase = storefront.new_purchase(product.sku)
    storefront.get(f"purchases/{purchase['id']}")  # key verified, script loaded
    t = ApiClientRateThrottle
    ident = t.cache_format % {"scope": t.scope, "ident": f"client:{storefront.client.pk}"}
    before = _count(ident)
    busy = _busy_redis(stall_us)
    answer = storefront.get(f"purchases/{purchase['id']}" + ("" if fast else "?x=1"))
    busy.join(5)
    counted = _count(ident) - before
    print("status", answer.status_code, "counted", counted)
    assert answer.status_code == 200
    assert counted == 1, f"one request counted {counted} times"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast", [False, True], ids=["drf-only", "fast-path"])
def test_old_script_path_one_api_request_counted_once(
    storefront, product, settings, monkeypatch, fast
):
    """send_script replaced by the pre-af921b0 call (redis-py's Script alone), same 1.5 s
    stall. drf-only: counted once (so the double count above was af921b0's).
    fast-path failed before its fix, independently of af921b0: the fast path's count raised
    (timeout) after Redis had run the script; fast() swallowed the error, set no COUNTED
    decision, and the DRF throttle counted the same request again."""
    import payments.api.ratelimit as rl
    from payments.api.authentication import ApiClientRateThrottle

    class _ScriptAlone:  # send_script's shape: the call happens when the reply is asked
        def __init__(self, client, script, *, keys, args):
            self.call = lambda: script(keys=keys, args=args)

        def reply(self):
            return self.call()

    monkeypatch.setattr(rl, "send_script", _ScriptAlone)
    settings.API_CLIENT_CACHE_SECONDS = 60
    settings.API_FAST_PATH = True
    purchase = storefront.new_purchase(product.sku)
    storefront.get(f"purchases/{purchase['id']}")
    t = ApiClientRateThrottle
    ident = t.cache_format % {"scope": t.scope, "ident": f"client:{storefront.client.pk}"}
    before = _count(ident)
    busy = _busy_redis(1_500_000)
    answer = storefront.get(f"purchases/{purchase['id']}" + ("" if fast else "?x=1"))
    busy.join(5)
    assert answer.status_code == 200
    counted = _count(ident) - before
    assert counted == 1, f"one request counted {counted} times"


def test_killed_connections_then_flush_count_once_and_keep_the_lockout():
    """A Redis restart as the pool sees it: every pooled connection killed by the server,
    and the scripts gone. One hit counts once; a locked prefix stays locked."""
    client = redis_client()
    ident = f"attack-kill:{time.time_ns()}"
    rate_limit_hit(ident=ident, limit=100, window_seconds=60)
    cache.set("api-auth-fail:prefix:attack-kill", 5, timeout=60)
    for _ in range(2):
        client.script_flush()
        killer = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
        killer.client_kill_filter(_type="normal", skipme=True)
        killer.close()
        locked = rate_limit_hit(
            ident=ident,
            limit=100,
            window_seconds=60,
            lock_keys=[("api-auth-fail:prefix:attack-kill", 5)],
        )
        assert locked.locked
    assert _count(ident) == 1
    client.script_flush()
    killer = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    killer.client_kill_filter(_type="normal", skipme=True)
    rate_limit_hit(ident=ident, limit=100, window_seconds=60)
    assert _count(ident) == 2
