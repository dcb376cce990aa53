"""The fast path counts a request as the DRF view does (the limiter's hit is sent before
the fast path's database read, its decision left on the request for the view). Every
answer the API gives on the two fast routes — fast or handed over,
200/400/401/403/404/405/406/409/415/
422/429 — counts the request against the client's limit exactly as the DRF view alone
does, and moves the failed-authentication counters exactly as it does. Counters are read
in Redis; each case is sent once with the fast path on and once with it off."""

import threading
import time

import pytest
import redis
from django.conf import settings as dj_settings
from django.core.cache import cache
from rest_framework.test import APIClient

from config.redis_client import redis_client
from payments.api.authentication import ApiClientRateThrottle
from tests.api.client import Api, new_key
from tests.api.test_fast_path_equivalence import BODY, _paid, _running
from tests.api.test_rate_limit_script_timeout import _BUSY
from tests.factories import make_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]

ADDR = "api-auth-fail:ip:127.0.0.1"


def _ident(client) -> str:
    t = ApiClientRateThrottle
    return t.cache_format % {"scope": t.scope, "ident": f"client:{client.pk}"}


def _raw(key: str) -> int:
    return int(redis_client().get(cache.make_key(key)) or 0)


def _snapshot(clients, extra=()) -> dict:
    out = {c.pk: _raw(f"rl:{_ident(c)}") for c in clients}
    for k in (ADDR, *extra):
        out[k] = int(cache.get(k) or 0)
    return out


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def test_every_answer_counts_as_the_drf_view_alone(
    storefront, other_storefront, product, fast_settings
):
    purchase, key = _paid(storefront, product)
    pid = purchase["id"]
    path = f"/api/v1/purchases/{pid}/payments"
    running = _running(storefront, path, lease_seconds=300)
    reader_client, reader_key = make_client(scopes=("purchases:read",), name="reader")
    reader = Api(reader_key, reader_client)
    reader.get("products")
    other_storefront.get("products")
    storefront.get("products")  # a client saved clears the cache: verify again
    wrong = f"{storefront.key.split('.')[0]}.not-the-secret"
    prefix = f"api-auth-fail:prefix:{storefront.key.split('.')[0]}"
    h = storefront.http
    cases = {
        "200 get": lambda: storefront.get(f"purchases/{pid}"),
        "200 replay": lambda: storefront.post(f"purchases/{pid}/payments", BODY, key=key),
        "404 other client": lambda: other_storefront.get(f"purchases/{pid}"),
        "404 no such id": lambda: storefront.get("purchases/pur_nope"),
        "404 replay no such id": lambda: storefront.post(
            "purchases/pur_nope/payments", BODY, key=new_key()
        ),
        "405 put": lambda: h.put(f"/api/v1/purchases/{pid}", {}, format="json"),
        "406 html": lambda: storefront.get(f"purchases/{pid}", HTTP_ACCEPT="text/html"),
        "409 in flight": lambda: storefront.post(f"purchases/{pid}/payments", BODY, key=running),
        "409 already paid": lambda: storefront.post(
            f"purchases/{pid}/payments", BODY, key=new_key()
        ),
        "415 text body": lambda: h.post(
            f"/api/v1/purchases/{pid}/payments",
            data="x",
            content_type="text/plain",
            HTTP_IDEMPOTENCY_KEY=key,
        ),
        "400 bad json": lambda: h.post(
            f"/api/v1/purchases/{pid}/payments",
            data="{",
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
        ),
        "400 no key": lambda: storefront.post(f"purchases/{pid}/payments", BODY, key=None),
        "422 reused": lambda: storefront.post(
            f"purchases/{pid}/payments", {**BODY, "payment_method": "pm_card_mastercard"}, key=key
        ),
        "403 scope": lambda: reader.post(f"purchases/{pid}/payments", BODY, key=key),
        "401 wrong secret": lambda: Api(wrong).get(f"purchases/{pid}"),
        "401 wrong secret post": lambda: Api(wrong).post(
            f"purchases/{pid}/payments", BODY, key=key
        ),
        "401 bearer": lambda: APIClient().get(
            f"/api/v1/purchases/{pid}", HTTP_AUTHORIZATION=f"Bearer {storefront.key}"
        ),
    }
    clients = (storefront.client, other_storefront.client, reader_client)
    failures = []
    for name, send in cases.items():
        deltas, statuses = [], []
        for on in (True, False):
            fast_settings.API_FAST_PATH = on
            cache.delete_many([ADDR, prefix])
            before = _snapshot(clients, (prefix,))
            answer = send()
            statuses.append(answer.status_code)
            deltas.append(_delta(before, _snapshot(clients, (prefix,))))
        fast_settings.API_FAST_PATH = True
        print(name, statuses, deltas)
        if statuses[0] != statuses[1] or deltas[0] != deltas[1]:
            failures.append((name, statuses, deltas))
        if not name.startswith("401"):
            # every non-401 answer counts at most once (the client's own counter)
            assert all(v in (0, 1) for d in deltas for v in d.values()), (name, deltas)
    cache.delete_many([ADDR, prefix])
    assert failures == []


def test_a_locked_address_is_refused_on_the_fast_path_behind_a_proxy(
    storefront, product, fast_settings
):
    """TRUSTED_PROXY_COUNT=1: the address the lockout counts is X-Forwarded-For's last hop.
    A locked address refuses a cached key's read and replay (429), nothing counted;
    another address is answered."""
    purchase, key = _paid(storefront, product)
    fast_settings.TRUSTED_PROXY_COUNT = 1
    fast_settings.API_AUTH_FAILURES_PER_ADDRESS = 3
    lock = "api-auth-fail:ip:203.0.113.9"
    cache.set(lock, 3, timeout=60)
    ident = f"rl:{_ident(storefront.client)}"
    try:
        for on in (True, False):
            fast_settings.API_FAST_PATH = on
            before = _raw(ident)
            a = storefront.get(
                f"purchases/{purchase['id']}", HTTP_X_FORWARDED_FOR="198.51.100.1, 203.0.113.9"
            )
            b = storefront.post(
                f"purchases/{purchase['id']}/payments",
                BODY,
                key=key,
                HTTP_X_FORWARDED_FOR="203.0.113.9",
            )
            assert (a.status_code, b.status_code) == (429, 429), (on, a.content, b.content)
            assert _raw(ident) == before
            ok = storefront.get(
                f"purchases/{purchase['id']}", HTTP_X_FORWARDED_FOR="203.0.113.9, 198.51.100.1"
            )
            assert ok.status_code == 200 and _raw(ident) == before + 1
    finally:
        cache.delete(lock)


def test_script_flush_between_requests_counts_each_once(storefront, product, fast_settings):
    purchase, key = _paid(storefront, product)
    ident = f"rl:{_ident(storefront.client)}"
    client = redis_client()
    for n in range(3):
        client.script_flush()
        before = _raw(ident)
        a = storefront.get(f"purchases/{purchase['id']}")
        assert a.status_code == 200 and getattr(a, "verity_fast_path", False)
        assert _raw(ident) == before + 1, n
        client.script_flush()
        b = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
        assert b.status_code == 200 and getattr(b, "verity_fast_path", False)
        assert _raw(ident) == before + 2, n


def test_a_stalled_reply_leaves_every_pooled_connection_in_step(storefront, product, fast_settings):
    """Redis busy past the socket timeout while the fast path's EVALSHA waits: the
    request is answered (fail-open), counted once (Redis runs it late), and no pooled
    connection hands a later command the late reply."""
    purchase, key = _paid(storefront, product)
    ident = f"rl:{_ident(storefront.client)}"
    before = _raw(ident)
    other = redis.Redis.from_url(dj_settings.CACHES["default"]["LOCATION"], socket_timeout=10)
    busy = threading.Thread(target=lambda: other.eval(_BUSY, 0, 1_500_000), daemon=True)
    busy.start()
    time.sleep(0.1)
    answer = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    busy.join(5)
    assert answer.status_code == 200 and answer["Idempotent-Replayed"] == "true"
    assert _raw(ident) == before + 1
    client = redis_client()
    for n in range(30):
        client.set(f"r6-step-{n}", n)
        assert int(client.get(f"r6-step-{n}")) == n
        assert cache.get("r6-missing") is None
    for _ in range(5):
        again = storefront.get(f"purchases/{purchase['id']}")
        assert again.status_code == 200 and again.json()["id"] == purchase["id"]
    assert _raw(ident) == before + 6


@pytest.mark.parametrize("cookies", ["session", "csrf-bad", "csrf-good"])
def test_requests_with_cookies_count_once_on_both_paths(
    storefront, product, fast_settings, cookies
):
    """A console session cookie (the middleware declines; the view's wrapper counts) or a
    CSRF cookie (the middleware answers): one count per request either way."""
    import uuid

    from django.contrib.auth.models import User

    purchase, key = _paid(storefront, product)
    jar = {}
    if cookies == "session":
        user = User.objects.create_user(username=f"ops-{uuid.uuid4().hex[:6]}", password="pw")
        storefront.http.force_login(user)
        jar["sessionid"] = storefront.http.cookies["sessionid"].value
    else:
        jar["csrftoken"] = "bad" if cookies == "csrf-bad" else "a" * 32
    ident = f"rl:{_ident(storefront.client)}"
    for on in (True, False):
        fast_settings.API_FAST_PATH = on
        for send in (
            lambda: storefront.get(f"purchases/{purchase['id']}"),
            lambda: storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key),
        ):
            storefront.http.cookies.clear()
            for k, v in jar.items():
                storefront.http.cookies[k] = v
            before = _raw(ident)
            answer = send()
            assert answer.status_code == 200, answer.content
            assert _raw(ident) == before + 1, (cookies, on)


def test_an_empty_accept_counts_as_the_drf_view_alone(storefront, product, fast_settings):
    """DRF refuses `Accept:` (present, empty) 406 in its negotiation, before authentication:
    nothing counted. The fast path answers it 200, counted."""
    purchase, key = _paid(storefront, product)
    ident = f"rl:{_ident(storefront.client)}"
    seen = []
    for on in (True, False):
        fast_settings.API_FAST_PATH = on
        before = _raw(ident)
        answer = storefront.get(f"purchases/{purchase['id']}", HTTP_ACCEPT="")
        seen.append((answer.status_code, _raw(ident) - before))
    print(seen)
    assert seen[0] == seen[1]
