"""Attacks on the API fast path (payments/api/fast_path.py) against the DRF view, and on
the limiter key they share (af921b0: cache.make_key). Real stack: the counter is read
in Redis, rows in PostgreSQL."""

import time
import uuid
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from config.redis_client import redis_client
from payments.api.authentication import ApiClientRateThrottle
from payments.api.idempotency import request_fingerprint
from payments.models import ApiClient, IdempotencyRecord, PaymentOperation
from tests.api.client import Api, new_key
from tests.api.test_fast_path_equivalence import BODY, _both, _paid
from tests.factories import make_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]


def _counter(client) -> int:
    t = ApiClientRateThrottle
    ident = t.cache_format % {"scope": t.scope, "ident": f"client:{client.pk}"}
    return int(redis_client().get(cache.make_key(f"rl:{ident}")) or 0)


def test_fast_path_and_drf_share_one_counter_counted_once(storefront, product):
    purchase, key = _paid(storefront, product)
    before = _counter(storefront.client)
    fast = storefront.get(f"purchases/{purchase['id']}")
    assert getattr(fast, "verity_fast_path", False) and fast.status_code == 200
    assert _counter(storefront.client) == before + 1
    drf = storefront.get(f"purchases/{purchase['id']}?x=1")  # query string: DRF only
    assert not hasattr(drf, "verity_fast_path")
    assert _counter(storefront.client) == before + 2
    missing = storefront.get(f"purchases/pur_{uuid.uuid4().hex[:12]}")  # fast -> DRF 404
    assert missing.status_code == 404
    assert _counter(storefront.client) == before + 3
    replay = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    assert replay.status_code == 200 and getattr(replay, "verity_fast_path", False)
    assert _counter(storefront.client) == before + 4


def test_another_clients_purchase_is_404_on_the_fast_path(storefront, other_storefront, product):
    purchase, key = _paid(storefront, product)
    other_storefront.get("purchases/pur_x")  # warm the other key
    seen = other_storefront.get(f"purchases/{purchase['id']}")
    assert seen.status_code == 404
    # Same Idempotency-Key and body from the other client: its own scope, a new request,
    # never the first client's operation.
    ops = PaymentOperation.objects.count()
    again = other_storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    assert again.status_code == 404, again.content
    assert PaymentOperation.objects.count() == ops


def test_same_key_different_body_is_422_and_in_flight_is_409(storefront, product):
    purchase, key = _paid(storefront, product)
    other = storefront.post(
        f"purchases/{purchase['id']}/payments", {**BODY, "capture": "manual"}, key=key
    )
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    # Whitespace/key order differ, same canonical body: a replay.
    same = storefront.http.post(
        f"/api/v1/purchases/{purchase['id']}/payments",
        data='{ "capture":"automatic" , "payment_method":"pm_card_visa"}',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert same.status_code == 200 and same["Idempotent-Replayed"] == "true"
    # In flight (not done): 409 with Retry-After, on either path.
    purchase2 = storefront.new_purchase(product.sku)
    key2 = new_key()
    IdempotencyRecord.objects.create(
        api_client=storefront.client,
        route="purchases_payments_create",
        key=key2,
        fingerprint=request_fingerprint(
            path=f"/api/v1/purchases/{purchase2['id']}/payments", body=BODY
        ),
        state=IdempotencyRecord.State.IN_FLIGHT,
        lease_until=timezone.now() + timedelta(seconds=60),
    )
    busy = storefront.post(f"purchases/{purchase2['id']}/payments", BODY, key=key2)
    assert busy.status_code == 409 and busy.get("Retry-After"), busy.content


def test_missing_scope_and_revoked_key_beyond_the_window(storefront, product, fast_settings):
    purchase, key = _paid(storefront, product)
    writer_only, wkey = make_client(scopes=("purchases:write",), name="w-only")
    w = Api(wkey, writer_only)
    assert w.get(f"purchases/{purchase['id']}").status_code in (403, 404)

    fast_settings.API_CLIENT_CACHE_SECONDS = 1
    from payments.client_cache import api_client_cache_clear

    api_client_cache_clear()
    assert storefront.get(f"purchases/{purchase['id']}").status_code == 200  # verified
    # Revoked by another process: no post_save here, the cache is not cleared.
    ApiClient.objects.filter(pk=storefront.client.pk).update(revoked=True)
    time.sleep(1.2)
    after = storefront.get(f"purchases/{purchase['id']}")
    assert after.status_code == 401 and not hasattr(after, "verity_fast_path")
    replay = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    assert replay.status_code == 401


def test_over_the_limit_is_429_and_counted_once_on_either_path(storefront, product, fast_settings):
    purchase, _ = _paid(storefront, product)
    c = _counter(storefront.client)
    fast_settings.API_THROTTLE_RATE = f"{c + 1}/min"
    ok = storefront.get(f"purchases/{purchase['id']}")
    assert ok.status_code == 200 and getattr(ok, "verity_fast_path", False)
    over = storefront.get(f"purchases/{purchase['id']}")
    assert over.status_code == 429 and over.get("Retry-After")
    assert not hasattr(over, "verity_fast_path")
    assert _counter(storefront.client) == c + 2
    over_drf = storefront.get(f"purchases/{purchase['id']}?x=1")
    assert over_drf.status_code == 429 and _counter(storefront.client) == c + 3


def test_a_locked_prefix_is_refused_on_the_fast_path_after_script_flush(
    storefront, product, fast_settings
):
    purchase, _ = _paid(storefront, product)
    prefix = storefront.key.partition(".")[0][:16]
    cache.set(
        f"api-auth-fail:prefix:{prefix}", fast_settings.API_AUTH_FAILURES_PER_PREFIX, timeout=60
    )
    redis_client().script_flush()
    c = _counter(storefront.client)
    locked = storefront.get(f"purchases/{purchase['id']}")
    assert locked.status_code == 429 and not hasattr(locked, "verity_fast_path")
    replay_locked = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=new_key())
    assert replay_locked.status_code == 429
    assert _counter(storefront.client) == c  # a locked request is not counted
    cache.delete(f"api-auth-fail:prefix:{prefix}")


@pytest.mark.parametrize("accept", ["", "*/*", "application/json", "application/*"])
def test_every_accept_the_fast_path_takes_answers_as_drf(
    storefront, product, fast_settings, accept
):
    purchase, key = _paid(storefront, product)
    headers = {"HTTP_ACCEPT": accept} if accept else {}

    for send in (
        lambda: storefront.http.get(f"/api/v1/purchases/{purchase['id']}", **headers),
        lambda: storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key, **headers),
    ):
        fast, drf = _both(fast_settings, send)
        assert getattr(fast, "verity_fast_path", False)
        assert fast.status_code == drf.status_code
        assert dict(fast.items()) == dict(drf.items())
        assert fast.content == drf.content
