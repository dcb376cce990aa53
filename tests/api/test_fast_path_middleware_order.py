"""The fast path before the session, CSRF, auth and database-error middleware answers as
the whole chain. Every request is sent twice against unchanged state — fast
path on, then off (API_FAST_PATH=False: the DRF view alone, behind the whole chain) — and
the two answers must be the same: status, headers, cookies, body. Real stack (PostgreSQL,
Redis, localstripe); counters are read in Redis."""

import uuid
from urllib.parse import quote

import pytest
from django.core.cache import cache
from django.test.utils import override_settings

from config.redis_client import redis_client
from payments.api import fast_path
from payments.api.authentication import ApiClientRateThrottle
from tests.api.client import Api
from tests.api.test_fast_path_equivalence import BODY, _paid

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]


def _counter(client) -> int:
    t = ApiClientRateThrottle
    ident = t.cache_format % {"scope": t.scope, "ident": f"client:{client.pk}"}
    return int(redis_client().get(cache.make_key(f"rl:{ident}")) or 0)


def _cookies(response) -> dict:
    # values of a fresh CSRF cookie are random: compare names and attributes
    return {
        name: {k: v for k, v in morsel.items() if v and k != "expires"}
        for name, morsel in response.cookies.items()
    }


def _both(api, settings, send, cookies=None):
    """(fast answer, DRF answer) of `send()`, each sent with the same cookie jar."""
    answers = []
    for on in (True, False):
        settings.API_FAST_PATH = on
        api.http.cookies.clear()
        for name, value in (cookies or {}).items():
            api.http.cookies[name] = value
        answers.append(send())
    settings.API_FAST_PATH = True
    api.http.cookies.clear()
    return tuple(answers)


def _same(fast, drf) -> None:
    assert fast.status_code == drf.status_code, (fast.status_code, drf.status_code)
    assert dict(fast.items()) == dict(drf.items())
    assert _cookies(fast) == _cookies(drf)
    assert fast.content == drf.content


def _fast(response) -> bool:
    return getattr(response, "verity_fast_path", False)


# -- cookies: the middleware the fast path now skips -----------------------------------


@pytest.mark.parametrize("cookie", ["bad", "x" * 40, "!" * 32])
def test_a_malformed_csrf_cookie_answers_the_same_on_both_paths(
    storefront, product, fast_settings, cookie
):
    """CsrfViewMiddleware replaces a malformed CSRF cookie on every response it sees
    (Set-Cookie: csrftoken=…, Vary: Cookie). The fast path answers before it."""
    purchase, key = _paid(storefront, product)
    for send in (
        lambda: storefront.get(f"purchases/{purchase['id']}"),
        lambda: storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key),
    ):
        fast, drf = _both(storefront, fast_settings, send, cookies={"csrftoken": cookie})
        print("fast", _fast(fast), dict(fast.items()), _cookies(fast))
        print("drf ", dict(drf.items()), _cookies(drf))
        _same(fast, drf)


def test_a_well_formed_csrf_cookie_answers_the_same_on_both_paths(
    storefront, product, fast_settings
):
    purchase, key = _paid(storefront, product)
    fast, drf = _both(
        storefront,
        fast_settings,
        lambda: storefront.get(f"purchases/{purchase['id']}"),
        cookies={"csrftoken": "a" * 32},
    )
    assert _fast(fast)
    _same(fast, drf)


def test_a_console_users_session_with_an_api_key_answers_the_same(
    storefront, product, fast_settings
):
    """A signed-in console user's session cookie next to an API key: the middleware
    declines, the view's wrapper answers early, SessionLifetimeMiddleware still slides the
    session on both paths."""
    from django.contrib.auth.models import User
    from django.contrib.sessions.models import Session

    from config.sessions import SEEN_AT

    purchase, key = _paid(storefront, product)
    user = User.objects.create_user(username=f"ops-{uuid.uuid4().hex[:6]}", password="pw")
    storefront.http.force_login(user)
    sid = storefront.http.cookies["sessionid"].value
    seen = []
    for on in (True, False):
        fast_settings.API_FAST_PATH = on
        storefront.http.cookies["sessionid"] = sid
        a = storefront.get(f"purchases/{purchase['id']}")
        b = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
        seen.append((a, b, Session.objects.get(pk=sid).get_decoded().get(SEEN_AT)))
    (fa, fb, fseen), (da, db_, dseen) = seen
    assert fa.status_code == da.status_code == 200 and fb.status_code == db_.status_code == 200
    assert fseen is not None and dseen is not None and dseen >= fseen
    for f, d in ((fa, da), (fb, db_)):
        assert dict(f.items()) == dict(d.items())
        assert _cookies(f) == _cookies(d)
        assert f.content == d.content


# -- methods, paths, query strings, Accept ---------------------------------------------


def test_other_methods_and_odd_paths_answer_the_same(storefront, product, fast_settings):
    purchase, key = _paid(storefront, product)
    pid = purchase["id"]
    encoded = "".join(f"%{ord(c):02X}" for c in pid)  # every character percent-encoded
    h = storefront.http
    cases = {
        "head": lambda: h.head(f"/api/v1/purchases/{pid}"),
        "options": lambda: h.options(f"/api/v1/purchases/{pid}"),
        "options-payments": lambda: h.options(f"/api/v1/purchases/{pid}/payments"),
        "put": lambda: h.put(f"/api/v1/purchases/{pid}", {}, format="json"),
        "get-payments": lambda: h.get(f"/api/v1/purchases/{pid}/payments"),
        "trailing-slash": lambda: h.get(f"/api/v1/purchases/{pid}/"),
        "trailing-slash-post": lambda: h.post(
            f"/api/v1/purchases/{pid}/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY=key
        ),
        "double-slash": lambda: h.get(f"/api/v1/purchases//{pid}"),
        "percent-encoded": lambda: h.get(f"/api/v1/purchases/{encoded}"),
        "percent-encoded-post": lambda: h.post(
            f"/api/v1/purchases/{encoded}/payments", BODY, format="json", HTTP_IDEMPOTENCY_KEY=key
        ),
        "upper-case-id": lambda: h.get(f"/api/v1/purchases/{pid.upper()}"),
        "unicode-id": lambda: h.get("/api/v1/purchases/" + quote("pür_ø\u200b")),
        "ctl-id": lambda: h.get("/api/v1/purchases/pur%01x"),
        "nul-id": lambda: h.get("/api/v1/purchases/pur%00x"),
        "long-id": lambda: h.get("/api/v1/purchases/" + "p" * 5000),
        "broken-utf8": lambda: h.get("/api/v1/purchases/pur%FFx"),
        "dot-segments": lambda: h.get(f"/api/v1/purchases/x/../{pid}"),
        "empty-query": lambda: h.get(f"/api/v1/purchases/{pid}?"),
        "query": lambda: h.get(f"/api/v1/purchases/{pid}?format=json"),
        "accept-indent": lambda: h.get(
            f"/api/v1/purchases/{pid}", HTTP_ACCEPT="application/json; indent=4"
        ),
        "accept-html": lambda: h.get(f"/api/v1/purchases/{pid}", HTTP_ACCEPT="text/html"),
        "accept-app": lambda: h.get(f"/api/v1/purchases/{pid}", HTTP_ACCEPT="application/*"),
        "accept-any": lambda: h.get(f"/api/v1/purchases/{pid}", HTTP_ACCEPT=" */* "),
        "accept-upper": lambda: h.get(f"/api/v1/purchases/{pid}", HTTP_ACCEPT="APPLICATION/JSON"),
        "accept-list": lambda: h.get(
            f"/api/v1/purchases/{pid}", HTTP_ACCEPT="application/json, text/html;q=0.1"
        ),
        "replay-charset": lambda: h.post(
            f"/api/v1/purchases/{pid}/payments",
            data=b'{"payment_method":"pm_card_visa","capture":"automatic"}',
            content_type="application/json; charset=latin-1",
            HTTP_IDEMPOTENCY_KEY=key,
        ),
        "replay-key-spaces": lambda: h.post(
            f"/api/v1/purchases/{pid}/payments",
            BODY,
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"  {key} ",
        ),
        "replay-body-reordered": lambda: h.post(
            f"/api/v1/purchases/{pid}/payments",
            data=b'{ "capture" : "automatic", "payment_method":"pm_card_visa" }',
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
        ),
        "replay-dup-keys": lambda: h.post(
            f"/api/v1/purchases/{pid}/payments",
            data=b'{"payment_method":"pm_card_visa","capture":"automatic","capture":"automatic"}',
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
        ),
    }
    failures = []
    for name, send in cases.items():
        fast, drf = _both(storefront, fast_settings, send)
        print(name, fast.status_code, _fast(fast), drf.status_code)
        try:
            _same(fast, drf)
        except AssertionError as exc:
            failures.append((name, fast.status_code, drf.status_code, str(exc)[:300]))
    assert failures == []


def test_a_disallowed_host_is_400_before_the_fast_path(storefront, product, fast_settings):
    purchase, key = _paid(storefront, product)
    before = _counter(storefront.client)
    for send in (
        lambda: storefront.get(f"purchases/{purchase['id']}", HTTP_HOST="evil.example"),
        lambda: storefront.post(
            f"purchases/{purchase['id']}/payments", BODY, key=key, HTTP_HOST="evil.example"
        ),
    ):
        fast, drf = _both(storefront, fast_settings, send)
        assert fast.status_code == 400 and not _fast(fast)
        _same(fast, drf)
    assert _counter(storefront.client) == before  # refused before anything counted


def test_https_redirect_and_security_headers_on_both_paths(storefront, product, fast_settings):
    purchase, key = _paid(storefront, product)
    fast_settings.SECURE_SSL_REDIRECT = True
    fast_settings.SECURE_HSTS_SECONDS = 3600
    fast_settings.SECURE_REFERRER_POLICY = "same-origin"
    fast_settings.SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
    # SecurityMiddleware reads its settings when the handler loads it: a new test client
    api = Api(storefront.key, storefront.client)
    before = _counter(storefront.client)
    # http: the redirect, nothing counted
    fast, drf = _both(api, fast_settings, lambda: api.get(f"purchases/{purchase['id']}"))
    assert fast.status_code == 301 and not _fast(fast)
    _same(fast, drf)
    assert _counter(storefront.client) == before
    # https: answered, every security header on both
    for send in (
        lambda: api.get(f"purchases/{purchase['id']}", secure=True),
        lambda: api.post(f"purchases/{purchase['id']}/payments", BODY, key=key, secure=True),
    ):
        fast, drf = _both(api, fast_settings, send)
        assert fast.status_code == 200 and _fast(fast)
        assert fast["Strict-Transport-Security"].startswith("max-age=3600")
        assert fast["X-Frame-Options"] == "DENY"
        assert fast["Referrer-Policy"] == "same-origin"
        _same(fast, drf)
    # behind a proxy that says https
    fast_settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    api = Api(storefront.key, storefront.client)
    fast, drf = _both(
        api,
        fast_settings,
        lambda: api.get(f"purchases/{purchase['id']}", HTTP_X_FORWARDED_PROTO="https"),
    )
    assert fast.status_code == 200 and _fast(fast)
    _same(fast, drf)


# -- the route cache -------------------------------------------------------------------


def test_another_urlconf_is_not_answered_from_the_route_cache(storefront, product, fast_settings):
    """A path answered fast under config.urls, then the same path under a urlconf where it
    is no fast view: the cache is keyed by the urlconf, so the other view answers."""
    purchase, key = _paid(storefront, product)
    path = f"purchases/{purchase['id']}"
    assert _fast(storefront.get(path))
    with override_settings(ROOT_URLCONF="tests.api.fast_path_urls"):
        other = storefront.get(path)
        assert other.status_code == 418 and not _fast(other), other.content
    assert _fast(storefront.get(path))


def test_a_urlconf_changed_in_place_is_not_answered_from_a_stale_route(
    storefront, product, fast_settings
):
    """The same urlconf module re-pointed at another view (as a test's urlconf can be):
    Django's resolver caches are cleared (clear_url_caches), the fast path's is not."""
    from django.urls import clear_url_caches

    from tests.api import fast_path_urls

    purchase, key = _paid(storefront, product)
    path = f"purchases/{purchase['id']}"
    fast_path._fast_route.cache_clear()
    with override_settings(ROOT_URLCONF="tests.api.fast_path_urls"):
        saved = list(fast_path_urls.urlpatterns)
        fast_path_urls.urlpatterns[:] = fast_path_urls.fast_patterns()
        clear_url_caches()
        try:
            assert _fast(storefront.get(path))
            fast_path_urls.urlpatterns[:] = saved
            clear_url_caches()
            other = storefront.get(path)
            assert other.status_code == 418 and not _fast(other), other.content
        finally:
            fast_path_urls.urlpatterns[:] = saved
            clear_url_caches()
            fast_path._fast_route.cache_clear()


@pytest.mark.parametrize("accept", ["", "   "], ids=["empty", "blank"])
def test_a_present_but_empty_accept_answers_as_drf(storefront, product, fast_settings, accept):
    """`Accept:` sent with no value is not a missing header: DRF's negotiation finds no
    media type in it and answers 406; the fast path treats it as absent (`""` in
    _ACCEPTS, after .strip())."""
    purchase, key = _paid(storefront, product)
    for send in (
        lambda: storefront.get(f"purchases/{purchase['id']}", HTTP_ACCEPT=accept),
        lambda: storefront.post(
            f"purchases/{purchase['id']}/payments", BODY, key=key, HTTP_ACCEPT=accept
        ),
    ):
        fast, drf = _both(storefront, fast_settings, send)
        print(repr(accept), "fast", fast.status_code, _fast(fast), "drf", drf.status_code)
        _same(fast, drf)
