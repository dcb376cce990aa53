"""The early webhook path answers as the whole middleware chain. Every request is sent to a client
with settings.MIDDLEWARE as shipped
(early) and to a fresh client with the early middleware removed (the whole chain); the two
answers must be the same (status, every header, cookies, body) and so must the effects
(webhooks_providerevent, recovery_outboxmessage rows, verity_webhook_* counters)."""

import json

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from recovery.models import OutboxMessage
from tests.webhooks.events import event_for, intent_object, sign
from webhooks import views as webhook_views
from webhooks.models import ProviderEvent

pytestmark = pytest.mark.django_db

EARLY = "config.early_webhook.EarlyWebhookMiddleware"
PATH = "/webhooks/stripe/"


def _event(event_id: str) -> bytes:
    return json.dumps(
        event_for(
            intent_object(
                pi_id="pi_early",
                status="succeeded",
                amount=1500,
                metadata={"purchase_id": "pur_early"},
            ),
            "payment_intent.succeeded",
            event_id=event_id,
        )
    ).encode()


def _counters() -> dict:
    out = {}
    for metric in REGISTRY.collect():
        if metric.name.startswith("verity_webhook"):
            for s in metric.samples:
                if s.name.endswith("_total"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _rows() -> tuple:
    return (
        ProviderEvent.objects.filter(event_id__startswith="evt_early").count(),
        OutboxMessage.objects.filter(dedupe_key__startswith="event:evt_early").count(),
    )


def _cookies(response) -> dict:
    return {
        name: {k: v for k, v in morsel.items() if v and k != "expires"}
        for name, morsel in response.cookies.items()
    }


def _send(settings, early: bool, send):
    """(response, counter delta, (events, outbox) delta) of send(client)."""
    if not early:
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != EARLY]
    try:
        client = Client(raise_request_exception=False)
        before, rows = _counters(), _rows()
        response = send(client)
        after_rows = _rows()
        return (
            response,
            _delta(before, _counters()),
            (after_rows[0] - rows[0], after_rows[1] - rows[1]),
        )
    finally:
        if not early:
            settings.MIDDLEWARE = [*settings.MIDDLEWARE[:5], EARLY, *settings.MIDDLEWARE[5:]]


def _assert_same(settings, send_early, send_chain=None):
    early = _send(settings, True, send_early)
    chain = _send(settings, False, send_chain or send_early)
    e, c = early[0], chain[0]
    print("early", e.status_code, dict(e.items()), early[1:], e.content[:300])
    print("chain", c.status_code, dict(c.items()), chain[1:], c.content[:300])
    assert e.status_code == c.status_code
    assert dict(e.items()) == dict(c.items())
    assert _cookies(e) == _cookies(c)
    assert e.content == c.content
    assert early[1:] == chain[1:]
    return early, chain


def _post(body: bytes, *, path=PATH, signed=True, **extra):
    headers = {"HTTP_STRIPE_SIGNATURE": sign(body)} if signed else {}
    return lambda c: c.post(
        path, data=body, content_type="application/json", **{**headers, **extra}
    )


def test_the_restore_helper_puts_the_early_middleware_back_where_it_was(settings):
    shipped = list(settings.MIDDLEWARE)
    _send(settings, False, lambda c: None)
    assert list(settings.MIDDLEWARE) == shipped


def test_a_new_event_then_its_redelivery_answer_and_count_the_same(settings):
    early, chain = _assert_same(
        settings, _post(_event("evt_early_new_a")), _post(_event("evt_early_new_b"))
    )
    assert early[0].status_code == 200 and early[2] == (1, 1)
    _assert_same(settings, _post(_event("evt_early_new_a")))
    _assert_same(settings, _post(_event("evt_early_new_b")))


@pytest.mark.parametrize("method", ["get", "head", "options", "put", "patch", "delete"])
def test_other_methods_answer_the_same(settings, method):
    body = _event("evt_early_method")
    _assert_same(
        settings,
        lambda c: (
            getattr(c, method)(
                PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body)
            )
            if method not in ("get", "head")
            else getattr(c, method)(PATH)
        ),
    )


@pytest.mark.parametrize(
    "case", ["bad signature", "no signature", "not json", "empty", "stale", "not an event"]
)
def test_refused_deliveries_answer_and_count_the_same(settings, case):
    body = _event("evt_early_refused")
    send = {
        "bad signature": lambda c: c.post(
            PATH,
            data=body,
            content_type="application/json",
            HTTP_STRIPE_SIGNATURE=sign(body, "whsec_wrong"),
        ),
        "no signature": _post(body, signed=False),
        "not json": _post(b"{not json"),
        "empty": _post(b""),
        "stale": lambda c: c.post(
            PATH,
            data=body,
            content_type="application/json",
            HTTP_STRIPE_SIGNATURE=sign(body, ts=1_000_000),
        ),
        "not an event": _post(b'{"id": "evt_early_x", "object": "charge"}'),
    }[case]
    early, _ = _assert_same(settings, send)
    assert early[2] == (0, 0)


def test_a_signed_event_sent_as_text_plain_answers_the_same(settings):
    def send(event_id):
        body = _event(event_id)
        return lambda c: c.post(
            PATH, data=body, content_type="text/plain", HTTP_STRIPE_SIGNATURE=sign(body)
        )

    _assert_same(settings, send("evt_early_text_a"), send("evt_early_text_b"))


@pytest.mark.parametrize(
    "path",
    [
        "/webhooks/stripe",
        "//webhooks/stripe/",
        "/webhooks//stripe/",
        "/webhooks/%73tripe/",
        "/webhooks/stripe/?x=1",
        "/webhooks/stripe/extra",
        "/WEBHOOKS/stripe/",
    ],
)
def test_path_variants_answer_the_same(settings, path):
    _assert_same(
        settings,
        _post(_event("evt_early_path_a"), path=path),
        _post(_event("evt_early_path_b"), path=path),
    )


def test_a_script_name_answers_the_same(settings):
    _assert_same(
        settings,
        _post(_event("evt_early_script_a"), SCRIPT_NAME="/verity"),
        _post(_event("evt_early_script_b"), SCRIPT_NAME="/verity"),
    )
    settings.FORCE_SCRIPT_NAME = "/pay"
    _assert_same(settings, _post(_event("evt_early_force_a")), _post(_event("evt_early_force_b")))


def test_an_oversized_body_answers_and_counts_the_same(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64
    early, _ = _assert_same(settings, _post(_event("evt_early_big")))
    assert early[0].status_code == 400 and early[2] == (0, 0)


@pytest.mark.parametrize("length", ["", "0", "abc", "-1", "5"])
def test_a_missing_or_wrong_content_length_answers_the_same(settings, length):
    body = _event("evt_early_len")
    _assert_same(settings, _post(body, CONTENT_LENGTH=length))
    _assert_same(settings, _post(body, CONTENT_LENGTH=length, HTTP_TRANSFER_ENCODING="chunked"))


@pytest.mark.parametrize(
    "cookie", ["", ";", " ; ; ", "=", "garbage", "csrftoken=bad", "sessionid=nope", "a=b"]
)
def test_an_empty_or_malformed_cookie_header_answers_the_same(settings, cookie):
    _assert_same(
        settings,
        _post(_event("evt_early_cookie_a"), HTTP_COOKIE=cookie),
        _post(_event("evt_early_cookie_b"), HTTP_COOKIE=cookie),
    )


def test_https_redirect_and_a_disallowed_host_and_forwarded_headers_answer_the_same(settings):
    settings.SECURE_SSL_REDIRECT = True
    _assert_same(settings, _post(_event("evt_early_ssl")))
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    _assert_same(
        settings,
        _post(_event("evt_early_fwd_a"), HTTP_X_FORWARDED_PROTO="https"),
        _post(_event("evt_early_fwd_b"), HTTP_X_FORWARDED_PROTO="https"),
    )
    settings.SECURE_SSL_REDIRECT = False
    _assert_same(settings, _post(_event("evt_early_host"), HTTP_HOST="evil.example"))
    settings.USE_X_FORWARDED_HOST = True
    _assert_same(settings, _post(_event("evt_early_xfh"), HTTP_X_FORWARDED_HOST="evil.example"))
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_SSL_REDIRECT = False
    _assert_same(
        settings,
        _post(_event("evt_early_hsts_a"), secure=True),
        _post(_event("evt_early_hsts_b"), secure=True),
    )


@pytest.mark.parametrize("case", ["oversized body (400)", "unstorable signed event (500)"])
def test_under_debug_an_error_page_answers_the_same(settings, case, monkeypatch):
    settings.DEBUG = True
    if case.startswith("oversized"):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64
        send, status = _post(_event("evt_early_dbg")), 400
    else:  # a bug in the ingest (an impossible `created` was one, now stored rejected)

        def unstorable(*, event):
            raise RuntimeError("cannot store")

        monkeypatch.setattr(webhook_views, "event_ingest", unstorable)
        send, status = _post(_event("evt_early_dbg")), 500
    early = _send(settings, True, send)
    chain = _send(settings, False, send)
    e, c = early[0], chain[0]
    print(
        e.get("Vary"), c.get("Vary"), b"AnonymousUser" in e.content, b"AnonymousUser" in c.content
    )
    assert e.status_code == c.status_code == status
    assert early[1:] == chain[1:]  # the same counters and rows (none) either way
    assert e.get("Vary") == c.get("Vary")
