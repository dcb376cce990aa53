"""A fast path before DRF for the two hot clean reads: an idempotent replay of
`POST /api/v1/purchases/{id}/payments` and `GET /api/v1/purchases/{id}`.

It answers only when every check is clean — the API key was verified within the client
cache's window (payments.client_cache: the documented revocation window), the key holds the
route's scope, nothing in the request asks for DRF's negotiation (no query string, an
`Accept` that only JSON satisfies), the replay is recognised (record `done`, same
fingerprint: payments.api.idempotency.idempotency_replayed_operation, which reads the record
and the operation in one statement), and the rate limiter allows it with no lockout (one
Redis round trip: payments.api.ratelimit, sent before the PostgreSQL read and answered
after it, so the two round trips overlap). Anything else is handed,
untouched, to the very DRF view, which answers every error (401, 403, 404, 409, 422, 429 …)
as before. When the limit was already counted here the decision travels with the request
(payments.api.authentication.COUNTED), so a request is counted once.

The answer is the one the DRF view would give: the same presenter, DRF's JSONRenderer, the
same headers (`Allow`, `Cache-Control: no-store`, `Idempotent-Replayed: true`); a test
compares both paths byte for byte (tests/api/test_fast_path_equivalence.py).
`API_FAST_PATH = False` turns it off.
"""

from __future__ import annotations

import functools
import logging

from django.conf import settings
from django.http import HttpResponse
from django.urls import Resolver404, get_resolver, get_urlconf
from rest_framework.renderers import JSONRenderer

from recovery.metrics import IDEMPOTENT_REPLAYS

from ..client_cache import api_client_cached
from . import presenters
from .authentication import COUNTED, KEYWORD, ApiClientRateThrottle, _failure_keys
from .idempotency import (
    HEADER,
    MAX_KEY_LENGTH,
    NOT_A_REPLAY,
    REPLAYED_HEADER,
    idempotency_replayed_operation,
    replay_body,
)
from .ratelimit import Decision, PendingDecision, parse_rate, rate_limit_send

logger = logging.getLogger(__name__)

_ACCEPTS = frozenset({"*/*", "application/json", "application/*"})
_KEYWORD = KEYWORD.lower()
_RENDERER = JSONRenderer()
_IDEM_META = "HTTP_" + HEADER.upper().replace("-", "_")


def _allow_header(cls) -> str:
    # DRF's `Allow`: the methods the view defines (Django adds `head` for a `get`).
    names = [
        m for m in cls.http_method_names if hasattr(cls, m) or (m == "head" and hasattr(cls, "get"))
    ]
    return ", ".join(m.upper() for m in names)


def _clean(request, kwargs, method: str) -> bool:
    return (
        request.method == method
        and not request.META.get("QUERY_STRING")
        and _json_only(request.META.get("HTTP_ACCEPT"))
        and not any("\x00" in str(v) for v in kwargs.values())
    )


def _json_only(accept: str | None) -> bool:
    """No `Accept` header, or one only JSON satisfies. A header sent empty is not the same:
    DRF finds no media type in it and answers 406."""
    return accept is None or accept.strip() in _ACCEPTS


def _client(request, scope: str):
    """(client, key) for a key verified within the cache window holding `scope`, or None."""
    scheme, _, key = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    key = key.strip()
    if scheme.lower() != _KEYWORD or not key:
        return None
    client = api_client_cached(key)
    if client is None or not client.has_scope(scope):
        return None
    return client, key


def _count(request, client, key: str) -> PendingDecision:
    """Count this request against the client's limit, with the lockout, in one Redis round
    trip left open: the caller reads PostgreSQL meanwhile and then `_allowed` reads the
    answer, so the two round trips overlap."""
    limit, window = parse_rate(settings.API_THROTTLE_RATE)
    throttle = ApiClientRateThrottle
    ident = throttle.cache_format % {"scope": throttle.scope, "ident": f"client:{client.pk}"}
    return rate_limit_send(
        ident=ident, limit=limit, window_seconds=window, lock_keys=_failure_keys(request, key)
    )


def _allowed(request, pending: PendingDecision) -> bool:
    """The limiter's answer; a refusal is left to the DRF view, which reuses this very
    decision (the request is counted once, whichever path answers)."""
    try:
        decision = pending.decision()
    except Exception:  # noqa: BLE001 - Redis may have counted it all the same (a late reply)
        # The view must not count it again: it is allowed, as the view's own throttle
        # allows a request when the cache is unavailable, and the view answers it.
        logger.warning("throttle cache unavailable; request allowed", exc_info=True)
        setattr(request, COUNTED, Decision(allowed=True, wait_seconds=0))
        return False
    setattr(request, COUNTED, decision)
    return decision.allowed and not decision.locked


def _answer(data: dict, *, allow: str, headers: dict | None = None) -> HttpResponse:
    response = HttpResponse(
        _RENDERER.render(data, JSONRenderer.media_type, {}),
        status=200,
        content_type=JSONRenderer.media_type,
    )
    for name, value in (headers or {}).items():
        response[name] = value
    response["Allow"] = allow
    response["Cache-Control"] = "no-store"  # as payments.api.views.ApiView
    # Not a header: lets a test tell which path answered (HttpResponse declares no such
    # attribute, hence the ignore).
    response.verity_fast_path = True  # type: ignore[attr-defined]
    return response


def _purchase_get(request, kwargs, *, allow: str, scope: str, route: str):
    if not _clean(request, kwargs, "GET"):
        return None
    found = _client(request, scope)
    if found is None:
        return None
    client, key = found
    pending = _count(request, client, key)
    try:
        # The purchase and every read of its view: one round trip (payments.view_queries),
        # overlapping the limiter's.
        view = presenters.purchase_view_for_client(
            purchase_id=kwargs["purchase_id"], api_client=client
        )
    finally:
        allowed = _allowed(request, pending)
    if not allowed:
        return None
    if view is None:
        return None  # 404: the view's problem body
    return _answer(view, allow=allow)


def _payment_replay(request, kwargs, *, allow: str, scope: str, route: str):
    if not _clean(request, kwargs, "POST"):
        return None
    found = _client(request, scope)
    if found is None:
        return None
    client, key = found
    # META, not request.headers: the same value, without building every header's name.
    idem_key = (request.META.get(_IDEM_META) or "").strip()
    if not idem_key or len(idem_key) > MAX_KEY_LENGTH or not idem_key.isprintable():
        return None
    body = replay_body(request)
    if body is None:
        return None
    pending = _count(request, client, key)
    try:
        # The record and the operation it names: one statement (payments.api.idempotency),
        # overlapping the limiter's round trip.
        op = idempotency_replayed_operation(
            api_client=client, route=route, key=idem_key, path=request.path, body=body
        )
    finally:
        allowed = _allowed(request, pending)
    if op is None:
        setattr(request, NOT_A_REPLAY, True)
        return None
    if not allowed:
        return None
    IDEMPOTENT_REPLAYS.labels(route=route).inc()
    return _answer(presenters.operation_view(op), allow=allow, headers={REPLAYED_HEADER: "true"})


_HANDLERS = {
    "purchase_get": (_purchase_get, "purchases:read", "purchases_retrieve"),
    "payment_replay": (_payment_replay, "purchases:write", "purchases_payments_create"),
}


_FAST = "verity_fast_path"  # on a view wrapped by `fast`: how to answer it early
_TRIED = "_verity_fast_path_tried"  # on a request the middleware already tried


def _answer_early(request, view, kwargs):
    """The fast path's answer to `request` for `view`, or None (the view answers)."""
    setattr(request, _TRIED, True)
    if not getattr(settings, "API_FAST_PATH", True):
        return None
    handler, scope, route, allow = getattr(view, _FAST)
    try:
        return handler(request, kwargs, allow=allow, scope=scope, route=route)
    except Exception:  # noqa: BLE001 - the DRF view answers every failure itself
        logger.debug("fast path declined on an error", exc_info=True)
        return None


def fast(view, kind: str):
    """`view` (a DRF view function) behind the fast path `kind`: tried by
    `FastPathMiddleware` before the middleware an API request never uses, or, where that
    middleware is not installed, by this wrapper."""
    handler, scope, route = _HANDLERS[kind]

    @functools.wraps(view)  # keeps cls / initkwargs / csrf_exempt: the schema still sees it
    def wrapped(request, *args, **kwargs):
        if not getattr(request, _TRIED, False):
            answer = _answer_early(request, wrapped, kwargs)
            if answer is not None:
                return answer
        return view(request, *args, **kwargs)

    setattr(wrapped, _FAST, (handler, scope, route, _allow_header(view.cls)))
    return wrapped


class FastPathMiddleware:
    """The fast path before the session, CSRF, authentication, session-lifetime, messages
    and database-error middleware: a request with an API key and no cookie never
    uses them (it carries no cookie; the views are CSRF-exempt; a database error falls
    back to the view, behind them all). It sits after the middleware whose work every
    answer keeps — SecurityMiddleware (the HTTPS redirect, its headers), CommonMiddleware
    (the Host check, Content-Length) and XFrameOptionsMiddleware — and answers only
    requests under `_PREFIX` whose view `fast` wrapped; everything else, and every request
    it declines, goes on down the chain unchanged."""

    _PREFIX = "/api/v1/purchases/"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # Any cookie (a session, a CSRF token the CSRF middleware would replace, a stored
        # message): the whole chain, where the view's wrapper still tries the fast path.
        if request.path_info.startswith(self._PREFIX) and not request.COOKIES:
            route = _fast_route(get_resolver(get_urlconf()), request.path_info)
            if route is not None:
                answer = _answer_early(request, route[0], dict(route[1]))
                if answer is not None:
                    return answer
        return self.get_response(request)


@functools.lru_cache(maxsize=4096)
def _fast_route(resolver, path_info: str):
    """(view, kwargs) when `path_info` resolves to a view `fast` wrapped, else None —
    kept per path (an agent replays and polls the same purchase), bounded, and per
    resolver: a changed ROOT_URLCONF or `clear_url_caches()` gives a new one."""
    try:
        match = resolver.resolve(path_info)
    except Resolver404:
        return None
    if not hasattr(match.func, _FAST) or match.args:
        return None
    return match.func, tuple(match.kwargs.items())


__all__ = ["FastPathMiddleware", "fast"]
