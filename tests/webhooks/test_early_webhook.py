"""config.early_webhook answers a delivery before the session, CSRF, auth, session-lifetime,
messages and database-error middleware: the same answer as the whole chain for
every status the view gives, the view run once, a database error the same 503."""

import json

import pytest
from django.conf import settings
from django.db import OperationalError
from django.test import Client
from prometheus_client import REGISTRY

from recovery.models import OutboxMessage
from webhooks import views
from webhooks.models import ProviderEvent

from .events import event_for, intent_object, post

EARLY = "config.early_webhook.EarlyWebhookMiddleware"
# Headers every answer carries from the middleware above the early one, and the view's own.
COMPARED = (
    "Content-Type",
    "Content-Length",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "Referrer-Policy",
    "Cross-Origin-Opener-Policy",
    "Retry-After",
    "Allow",
    "Vary",
    "Set-Cookie",
)


def _event(event_id: str) -> dict:
    return event_for(
        intent_object(
            pi_id="pi_early", status="succeeded", amount=1500, metadata={"purchase_id": "pur_early"}
        ),
        "payment_intent.succeeded",
        event_id=event_id,
    )


def _answer(response) -> tuple:
    return (response.status_code, response.content, {name: response.get(name) for name in COMPARED})


@pytest.fixture
def messages_seen(monkeypatch):
    from django.contrib.messages.middleware import MessageMiddleware

    seen = []
    original = MessageMiddleware.process_request
    monkeypatch.setattr(
        MessageMiddleware,
        "process_request",
        lambda self, request: (seen.append(request.path), original(self, request))[1],
    )
    return seen


def test_the_early_middleware_is_installed_after_the_header_middleware():
    order = settings.MIDDLEWARE
    assert EARLY in order
    for before in (
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ):
        assert order.index(before) < order.index(EARLY)
    for after in (
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "config.db_unavailable.DatabaseUnavailableMiddleware",
    ):
        assert order.index(EARLY) < order.index(after)


@pytest.mark.django_db
def test_early_answers_equal_the_whole_chain_for_every_status(messages_seen, settings):
    early = Client(raise_request_exception=False)
    cases = {
        "new": lambda c, n: post(c, _event(f"evt_early_new_{n}")),
        "duplicate": lambda c, n: post(c, _event("evt_early_dup")),
        "bad signature": lambda c, n: post(c, _event(f"evt_early_bad_{n}"), secret="whsec_wrong"),
        "no signature": lambda c, n: post(c, _event(f"evt_early_none_{n}"), header=""),
        "not json": lambda c, n: post(c, b"{not json"),
        "GET": lambda c, n: c.get("/webhooks/stripe/"),
    }
    post(early, _event("evt_early_dup"))  # stored: from now on a redelivery
    early_answers = {name: _answer(send(early, "a")) for name, send in cases.items()}
    assert messages_seen == ["/webhooks/stripe/"]  # only the GET went down the chain

    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != EARLY]
    chain = Client(raise_request_exception=False)
    chain_answers = {
        name: _answer(send(chain, "a" if name != "new" else "b")) for name, send in cases.items()
    }

    assert [early_answers[n][0] for n in cases] == [200, 200, 400, 400, 400, 405]
    assert early_answers == chain_answers
    assert len(messages_seen) == 1 + len(cases)  # the chain ran for each
    assert ProviderEvent.objects.filter(event_id__startswith="evt_early_").count() == 3
    assert OutboxMessage.objects.filter(dedupe_key__startswith="event:evt_early_").count() == 3


@pytest.mark.django_db
def test_a_delivery_with_a_cookie_goes_down_the_whole_chain(client, messages_seen):
    client.cookies["csrftoken"] = "x" * 10  # malformed: the chain's CSRF middleware sees it
    answer = post(client, _event("evt_early_cookie"))
    assert answer.status_code == 200 and messages_seen == ["/webhooks/stripe/"]
    assert ProviderEvent.objects.filter(event_id="evt_early_cookie").count() == 1


def _failures(reason: str) -> float:
    return REGISTRY.get_sample_value("verity_webhook_failures_total", {"reason": reason}) or 0.0


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["early", "chain"])
@pytest.mark.parametrize(
    ("error", "status"),
    [
        (OperationalError("connection refused"), 503),  # the database: the chain's 503
        (RuntimeError("a bug"), 500),  # anything else: Django's 500
    ],
)
def test_a_failing_view_runs_once_and_answers_as_the_chain(
    path, error, status, monkeypatch, messages_seen, settings
):
    if path == "chain":
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != EARLY]
    calls = []

    def failing(*, event):
        calls.append(event["id"])
        raise error

    monkeypatch.setattr(views, "event_ingest", failing)
    before = _failures("server_error")
    event_id = f"evt_early_fail_{status}_{path}"

    answer = post(Client(raise_request_exception=False), _event(event_id))

    assert answer.status_code == status
    assert calls == [event_id]  # once: never handed on to the chain after it ran
    assert _failures("server_error") == before + 1
    assert ProviderEvent.objects.filter(event_id=event_id).count() == 0
    assert messages_seen == ([] if path == "early" else ["/webhooks/stripe/"])
    if status == 503:
        assert int(answer["Retry-After"]) > 0
        assert answer["Content-Type"].startswith("application/problem+json")
        assert json.loads(answer.content)["code"] == "database_unavailable"
