"""The limiter's one Redis round trip (payments.api.ratelimit, through
config.redis_client.run_script on a pooled connection): it counts once per request, and
after Redis lost its scripts (a restart, SCRIPT FLUSH) the next request still counts
once: the NOSCRIPT reply is taken through redis-py's own path, which loads the script."""

import pytest

from config.redis_client import redis_client
from payments.api.ratelimit import rate_limit_hit

pytestmark = pytest.mark.django_db


def test_each_hit_counts_once_also_after_redis_lost_its_scripts():
    client = redis_client()
    assert client is not None, "the test stack's cache is Redis"
    ident = "test-run-script:client:1"
    counts = []
    for flush in (False, False, True, False):
        if flush:
            client.script_flush()
        counts.append(rate_limit_hit(ident=ident, limit=3, window_seconds=60))

    assert [d.allowed for d in counts] == [True, True, True, False]
    assert all(not d.locked and 1 <= d.wait_seconds <= 60 for d in counts)


def test_a_lockout_counter_at_its_limit_refuses_without_counting():
    from django.core.cache import cache

    ident = "test-run-script:client:2"
    cache.set("api-auth-fail:prefix:abc", 5, timeout=60)  # as authentication writes it
    locked = rate_limit_hit(
        ident=ident, limit=10, window_seconds=60, lock_keys=[("api-auth-fail:prefix:abc", 5)]
    )
    free = rate_limit_hit(
        ident=ident, limit=1, window_seconds=60, lock_keys=[("api-auth-fail:prefix:abc", 6)]
    )

    assert (locked.allowed, locked.locked) == (False, True)
    assert (free.allowed, free.locked) == (True, False)  # the locked one was not counted
