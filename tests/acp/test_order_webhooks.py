"""Order events to the agent platform: from the outbox, signed with the platform's secret,
at least once with backoff, deduplicable (a stable Request-Id), and in the console's
stuck-outbox queue while delivery keeps failing."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.utils import timezone

from acp.models import AgentPlatform
from recovery.models import OutboxCategory, OutboxMessage
from recovery.relay import relay_drain_once
from support.selectors import queue_items
from tests.acp.conftest import issue_spt, new_email, valid

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_acp_test"


class Receiver:
    """The agent platform's webhook endpoint: records what arrives, answers `status`."""

    def __init__(self) -> None:
        self.received: list[tuple[dict, bytes]] = []
        self.status = 500
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers), body))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/acp/order_events"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver(settings):
    # The receiver listens on loopback, which the webhook transport refuses unless allowed
    # (development and tests only).
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    r = Receiver()
    yield r
    r.close()


def _drain_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        relay_drain_once()
        time.sleep(0.05)


def _verify(headers: dict, body: bytes) -> None:
    t, v1 = (part.split("=", 1)[1] for part in headers["Merchant-Signature"].split(","))
    expected = hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(v1, expected)


def test_order_created_is_delivered_signed_after_failures_and_deduplicable(
    agent, platform, tea, receiver, settings
):
    settings.OUTBOX_BACKOFF_BASE_SECONDS = 0.05
    settings.OUTBOX_BACKOFF_CAP_SECONDS = 0.2
    AgentPlatform.objects.create(
        api_client=platform[0], webhook_url=receiver.url, webhook_secret=SECRET
    )
    session = agent.create(tea.sku).json()
    r = agent.complete(session["id"], issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    order = valid("CheckoutSessionWithOrder", r.json())["order"]

    # The platform is failing: the event is retried with backoff, and after a few
    # attempts it is in the console's stuck-outbox queue with the error.
    def message():
        return OutboxMessage.objects.get(
            category=OutboxCategory.ACP_ORDER_EVENT, payload__event="order_create"
        )

    _drain_until(lambda: message().attempts >= 3)
    assert message().processed_at is None and "answered 500" in message().last_error
    stuck = [i for i in queue_items("stuck_outbox") if i.purchase_id == order["id"]]
    assert len(stuck) == 1 and "answered 500" in stuck[0].error
    assert "Acp order event" in stuck[0].summary

    # The platform recovers: every event is delivered, then processed; nothing after that.
    receiver.status = 200
    events = OutboxMessage.objects.filter(category=OutboxCategory.ACP_ORDER_EVENT)
    _drain_until(lambda: not events.filter(processed_at__isnull=True).exists())
    n = len(receiver.received)
    relay_drain_once()
    assert len(receiver.received) == n
    by_id: dict[str, set[bytes]] = {}
    for headers, body in receiver.received:
        _verify(headers, body)
        by_id.setdefault(headers["Request-Id"], set()).add(body)
    # Each event is one Request-Id, sent identically on every attempt: the receiver dedupes.
    assert all(len(bodies) == 1 for bodies in by_id.values())
    created = json.loads(next(iter(by_id[f"evt_{order['id']}_paid"])))
    assert created == {
        "type": "order_create",
        "data": {
            "type": "order",
            "id": order["id"],
            "checkout_session_id": session["id"],
            "permalink_url": order["permalink_url"],
            "status": "confirmed",
        },
    }
    assert (
        sum(1 for h, _ in receiver.received if h["Request-Id"] == f"evt_{order['id']}_paid") >= 4
    )  # 3 failed + delivered
    # The orchestrator moved the order on: updates, one event per status.
    updates = [json.loads(next(iter(b))) for rid, b in by_id.items() if not rid.endswith("_paid")]
    assert updates and {u["type"] for u in updates} == {"order_update"}
    assert events.count() == len(by_id)
    assert [i for i in queue_items("stuck_outbox") if i.purchase_id == order["id"]] == []


def test_no_platform_webhook_configured_means_nothing_is_sent(agent, tea, receiver):
    session = agent.create(tea.sku).json()
    assert agent.complete(session["id"], issue_spt(1250), new_email()).status_code == 200
    _drain_until(
        lambda: (
            not OutboxMessage.objects.filter(
                processed_at__isnull=True, available_at__lte=timezone.now()
            ).exists()
        )
    )
    events = OutboxMessage.objects.filter(category=OutboxCategory.ACP_ORDER_EVENT)
    assert events.exists() and not events.filter(processed_at__isnull=True).exists()
    assert receiver.received == []


def test_acp_platform_command_sets_the_webhook_and_prints_new_secrets_once(platform):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command(
        "acp_platform",
        platform[0].name,
        "--webhook-url",
        "https://platform.example/acp/events",
        "--new-signing-secret",
        stdout=out,
    )
    p = AgentPlatform.objects.get(api_client=platform[0])
    assert p.webhook_url == "https://platform.example/acp/events"
    assert p.webhook_secret in out.getvalue() and p.signing_secret in out.getvalue()
    call_command("acp_platform", platform[0].name, "--no-signing", stdout=StringIO())
    p.refresh_from_db()
    assert p.signing_secret == "" and p.webhook_secret


class _RolledBack(Exception):
    pass


def test_each_order_transition_writes_its_event_once_in_its_own_transaction(agent, tea):
    """Written by the service that saves the transition (no django-fsm receiver): the row
    is there inside the transition's transaction, gone with it when it rolls back, and
    there is exactly one per status change of the order, none for a refused transition."""
    from django.db import transaction
    from django_fsm.signals import post_transition

    from payments import services
    from payments.models import OperationTransition, Purchase

    assert not post_transition.has_listeners(Purchase)
    session = agent.create(tea.sku).json()
    r = agent.complete(session["id"], issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    pid = r.json()["order"]["id"]
    events = OutboxMessage.objects.filter(
        category=OutboxCategory.ACP_ORDER_EVENT, payload__purchase=pid
    )
    assert [(m.payload["event"], m.payload["status"]) for m in events] == [("order_create", "paid")]

    # Inside the transition's transaction the event exists; rolled back, neither does.
    with pytest.raises(_RolledBack), transaction.atomic():
        services.purchase_transition(purchase_id=pid, name="mark_fulfilling", cause="test")
        assert events.filter(payload__status="fulfilling").count() == 1
        raise _RolledBack
    assert Purchase.objects.get(pk=pid).status == "paid"
    assert not events.filter(payload__status="fulfilling").exists()

    services.purchase_transition(purchase_id=pid, name="mark_fulfilling", cause="test")
    services.purchase_transition(purchase_id=pid, name="mark_fulfilling", cause="test")  # refused
    services.purchase_transition(purchase_id=pid, name="mark_completed", cause="test")
    moves = list(
        OperationTransition.objects.filter(purchase_id=pid, field="status", operation__isnull=True)
        .exclude(target__in=("awaiting_payment", "payment_pending", "payment_unknown"))
        .order_by("id")
        .values_list("target", flat=True)
    )
    assert moves == ["paid", "fulfilling", "completed"]
    assert [(m.payload["event"], m.payload["status"]) for m in events.order_by("id")] == [
        ("order_create", "paid"),
        ("order_update", "fulfilling"),
        ("order_update", "completed"),
    ]


def test_a_rest_purchase_writes_no_order_event(tea, localstripe):
    from payments import services
    from tests.factories import make_client

    client, _ = make_client()
    quote = services.quote_create(
        api_client=client, currency="usd", items=[{"sku": tea.sku, "quantity": 1}]
    )
    purchase = services.purchase_create(
        api_client=client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference="rest-buyer",
    )
    op = services.payment_create(
        purchase_id=purchase.id, api_client=client, payment_method="pm_card_visa"
    )
    services.operation_dispatch(operation_id=op.id)
    purchase.refresh_from_db()
    assert purchase.status == "paid" and purchase.channel == "api"
    assert not OutboxMessage.objects.filter(category=OutboxCategory.ACP_ORDER_EVENT).exists()


def test_an_order_entering_a_status_again_is_a_new_event_with_its_own_request_id(
    agent, platform, tea, receiver
):
    """paid -> manual review -> paid again: the second `paid` is an update of the same
    order with its own Request-Id; under the first's a receiver deduping on it would drop
    it. Seen failing before the fix (the second was another `order_create` reusing
    `evt_<purchase>_paid`)."""
    from payments import services

    AgentPlatform.objects.create(
        api_client=platform[0], webhook_url=receiver.url, webhook_secret=SECRET
    )
    receiver.status = 200
    session = agent.create(tea.sku).json()
    r = agent.complete(session["id"], issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    pid = r.json()["order"]["id"]
    services.purchase_transition(purchase_id=pid, name="mark_manual_review", cause="test")
    services.purchase_transition(purchase_id=pid, name="mark_paid", cause="test")

    events = OutboxMessage.objects.filter(
        category=OutboxCategory.ACP_ORDER_EVENT, payload__purchase=pid
    ).order_by("id")
    assert [(m.payload["event"], m.payload["status"]) for m in events][:2] == [
        ("order_create", "paid"),
        ("order_update", "paid"),
    ]
    _drain_until(lambda: not events.filter(processed_at__isnull=True).exists())
    ids = [h["Request-Id"] for h, _ in receiver.received]
    assert ids[:2] == [f"evt_{pid}_paid", f"evt_{pid}_paid_2"]
    assert len(set(ids)) == len(ids)  # one delivery per event (it answered 200 at once)


def test_a_platform_url_that_resolves_to_a_private_address_is_refused_at_send(
    agent, platform, tea, receiver, settings
):
    """The order webhooks go through the storefront webhooks' transport: the platform's
    URL is checked at send time, like an endpoint's (a platform saved while the address was
    allowed, then refused: nothing reaches it, the outbox keeps the refusal)."""
    settings.OUTBOX_BACKOFF_BASE_SECONDS = 0.05
    settings.OUTBOX_BACKOFF_CAP_SECONDS = 0.2
    receiver.status = 200
    AgentPlatform.objects.create(
        api_client=platform[0], webhook_url=receiver.url, webhook_secret=SECRET
    )
    settings.WEBHOOK_ALLOW_LOOPBACK = False
    session = agent.create(tea.sku).json()
    r = agent.complete(session["id"], issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    events = OutboxMessage.objects.filter(category=OutboxCategory.ACP_ORDER_EVENT)
    _drain_until(lambda: events.filter(attempts__gte=2).exists())
    assert receiver.received == []
    assert all(m.processed_at is None for m in events)
    assert "refused" in events.filter(attempts__gte=2).first().last_error
