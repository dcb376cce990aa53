"""Order events to the agent platform: written to the outbox with the order's change,
handed by the outbox to the events app's delivery module (one claim, retry schedule,
disabling rule, halt and log with the storefront webhooks), signed with the platform's
secret, deduplicable by a stable Request-Id, in the console's delivery log and resendable."""

from __future__ import annotations

import ast
import hashlib
import hmac
import inspect
import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from acp.models import AgentPlatform
from audit.models import AuditEntry
from events.delivery import deliveries_send_due, retry_delay_seconds
from events.models import (
    DeliveryState,
    EndpointKind,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    new_secret_salt,
)
from events.selectors import endpoints_disabled_by_failures
from recovery.halts import halt_clear, halt_set
from recovery.models import OutboxCategory, OutboxMessage
from recovery.relay import relay_drain_once
from support.selectors import queue_items
from tests.acp.agent import new_email, valid
from tests.acp.tokens import issue_spt
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    """The agent platform's webhook endpoint: verifies the `Merchant-Signature` of what
    arrives, records it, answers `status`; `accepted` counts the 2xx answers per Request-Id
    (a receiver that dedupes on it takes each event once)."""

    def __init__(self) -> None:
        self.received: list[tuple[dict, bytes]] = []
        self.accepted: dict[str, int] = {}
        self.bad_signatures = 0
        self.status = 500
        # The platform's webhook secret, as acp_platform showed it (platform_for sets it).
        self.secret = ""
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = dict(self.headers)
                with receiver.lock:
                    receiver.received.append((headers, body))
                    status = receiver.status
                    if not _verifies(receiver.secret, headers, body):
                        receiver.bad_signatures += 1
                        status = 400
                    elif 200 <= status < 300:
                        rid = headers["Request-Id"]
                        receiver.accepted[rid] = receiver.accepted.get(rid, 0) + 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/acp/order_events"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver(settings):
    # The receiver listens on loopback, which the webhook transport refuses unless allowed
    # (development and tests only); the delivery schedule is shortened, not replaced.
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    settings.WEBHOOK_RETRY_SCHEDULE_SECONDS = [0.05, 0.1, 0.2]
    r = Receiver()
    yield r
    r.close()


def _pump(predicate, timeout: float = 30.0) -> None:
    """Run the relay (the outbox hands the order event over) and the delivery loop until
    `predicate()` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        relay_drain_once()
        deliveries_send_due()
        time.sleep(0.05)


# Kept for the tests below that only drain the outbox.
_drain_until = _pump


def _verifies(secret: str, headers: dict, body: bytes) -> bool:
    t, v1 = (part.split("=", 1)[1] for part in headers["Merchant-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return bool(secret) and hmac.compare_digest(v1, expected)


def _settled() -> bool:
    now = timezone.now()
    return not WebhookDelivery.objects.filter(state=DeliveryState.PENDING).exists() and not (
        OutboxMessage.objects.filter(processed_at__isnull=True, available_at__lte=now).exists()
    )


def platform_for(api_client, receiver) -> AgentPlatform:
    """The platform as acp_platform leaves it: a salt on its row, its webhook secret derived
    from it (never stored); the receiver verifies with that secret."""
    platform = AgentPlatform.objects.create(
        api_client=api_client, webhook_url=receiver.url, webhook_secret_salt=new_secret_salt()
    )
    receiver.secret = platform.current_webhook_secret()
    return platform


def _platform(platform, receiver) -> AgentPlatform:
    return platform_for(platform[0], receiver)


def _order(agent, tea) -> tuple[dict, dict]:
    session = agent.create(tea.sku).json()
    r = agent.complete(session["id"], issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    return session, valid("CheckoutSessionWithOrder", r.json())["order"]


def test_a_failing_platform_is_retried_on_the_delivery_schedule_then_gets_each_event_once(
    agent,
    platform,
    tea,
    receiver,
    login,  # noqa: F811
):
    _platform(platform, receiver)
    session, order = _order(agent, tea)
    pid = order["id"]
    created = WebhookDelivery.objects.filter(purchase_id=pid, message_id=f"evt_{pid}_paid")

    # The platform is failing: the delivery module retries the event on its own schedule.
    _pump(lambda: created.filter(attempts__gte=3).exists())
    delivery = created.get()
    assert delivery.endpoint.kind == EndpointKind.ACP and delivery.endpoint.url == receiver.url
    assert delivery.state == DeliveryState.PENDING and delivery.last_status == 500
    # The outbox handed the fact over once and is done with it: no retry of its own.
    message = OutboxMessage.objects.get(
        category=OutboxCategory.ACP_ORDER_EVENT, payload__event="order_create"
    )
    assert message.processed_at is not None and message.last_error == ""
    # The same policy as a storefront endpoint's: the next try is the schedule's delay after
    # the last attempt, and retries stop WEBHOOK_RETRY_SECONDS after the first.
    from django.conf import settings

    last = WebhookAttempt.objects.filter(delivery=delivery).order_by("-at").first()
    assert delivery.next_attempt_at - last.at == timedelta(
        seconds=retry_delay_seconds(delivery.attempts)
    )
    window = (delivery.give_up_at - delivery.created_at).total_seconds()
    assert abs(window - settings.WEBHOOK_RETRY_SECONDS) < 60
    assert WebhookAttempt.objects.filter(delivery=delivery, status_code=500).count() >= 3
    assert delivery.endpoint.failing_since is not None

    # The console's delivery log of the purchase shows it with its answer.
    page = login("support").get(reverse("support:webhooks") + f"?purchase={pid}")
    html = page.content.decode()
    assert f'data-delivery="{delivery.pk}"' in html
    assert "acp order_create confirmed" in html and "HTTP 500" in html
    assert receiver.secret not in html

    # The platform recovers: every event arrives, each accepted once, signed, unchanged.
    receiver.status = 200
    _pump(
        lambda: (
            _settled()
            and WebhookDelivery.objects.filter(purchase_id=pid, message_id__endswith="_completed")
            .filter(state=DeliveryState.DELIVERED)
            .exists()
        )
    )
    n = len(receiver.received)
    relay_drain_once()
    assert deliveries_send_due() == 0 and len(receiver.received) == n
    assert receiver.bad_signatures == 0
    by_id: dict[str, set[bytes]] = {}
    for headers, body in receiver.received:
        assert _verifies(receiver.secret, headers, body)
        by_id.setdefault(headers["Request-Id"], set()).add(body)
    # Each event is one Request-Id, sent identically on every attempt: the receiver dedupes.
    assert all(len(bodies) == 1 for bodies in by_id.values())
    assert receiver.accepted == {rid: 1 for rid in by_id}
    body = json.loads(next(iter(by_id[f"evt_{pid}_paid"])))
    assert body == {
        "type": "order_create",
        "data": {
            "type": "order",
            "id": pid,
            "checkout_session_id": session["id"],
            "permalink_url": order["permalink_url"],
            "status": "confirmed",
        },
    }
    assert sum(1 for h, _ in receiver.received if h["Request-Id"] == f"evt_{pid}_paid") >= 4
    # The orchestrator moved the order on: updates, one event per status, one delivery each.
    updates = [json.loads(next(iter(b))) for rid, b in by_id.items() if not rid.endswith("_paid")]
    assert updates and {u["type"] for u in updates} == {"order_update"}
    deliveries = WebhookDelivery.objects.filter(purchase_id=pid)
    events = OutboxMessage.objects.filter(category=OutboxCategory.ACP_ORDER_EVENT)
    assert deliveries.count() == events.count() == len(by_id)
    assert set(deliveries.values_list("state", flat=True)) == {DeliveryState.DELIVERED}
    assert not WebhookEndpoint.objects.filter(failing_since__isnull=False).exists()
    assert [i for i in queue_items("stuck_outbox") if i.purchase_id == pid] == []


def test_an_operator_resends_an_order_webhook_from_the_console(
    agent,
    platform,
    tea,
    receiver,
    login,  # noqa: F811
):
    _platform(platform, receiver)
    receiver.status = 200
    _, order = _order(agent, tea)
    pid = order["id"]
    delivery = WebhookDelivery.objects.filter(purchase_id=pid, message_id=f"evt_{pid}_paid")
    _pump(lambda: delivery.filter(state=DeliveryState.DELIVERED).exists())
    first = [(h, b) for h, b in receiver.received if h["Request-Id"] == f"evt_{pid}_paid"]
    assert len(first) == 1

    answer = login("operator").post(
        reverse("support:webhook-delivery-resend", args=[delivery.get().pk]),
        {"reason": "the platform lost it", "confirm": "yes"},
    )
    assert answer.status_code in (200, 302)
    assert AuditEntry.objects.filter(action="webhook_delivery_resend").count() == 1
    _pump(lambda: delivery.filter(state=DeliveryState.DELIVERED, attempts=2).exists())
    again = [(h, b) for h, b in receiver.received if h["Request-Id"] == f"evt_{pid}_paid"]
    assert len(again) == 2 and again[0][1] == again[1][1]  # the same event, the same body
    for headers, body in again:
        assert _verifies(receiver.secret, headers, body)
    assert WebhookAttempt.objects.filter(delivery=delivery.get()).count() == 2


def test_order_webhooks_wait_while_webhooks_are_halted(agent, platform, tea, receiver):
    _platform(platform, receiver)
    receiver.status = 200
    halt_set(name="webhooks", reason="receiver incident", actor="ops")
    _, order = _order(agent, tea)
    pid = order["id"]
    pending = WebhookDelivery.objects.filter(purchase_id=pid)
    _drain_until(lambda: pending.exists())
    for _ in range(3):
        assert deliveries_send_due() == 0
    assert receiver.received == []
    assert set(pending.values_list("state", "attempts")) == {(DeliveryState.PENDING, 0)}
    halt_clear(name="webhooks", reason="over", actor="ops")
    _pump(lambda: pending.filter(state=DeliveryState.DELIVERED).exists())
    assert receiver.accepted.get(f"evt_{pid}_paid") == 1


def test_a_platform_failing_past_the_window_is_disabled_with_its_reason(
    agent, platform, tea, receiver, settings
):
    settings.WEBHOOK_DISABLE_AFTER_SECONDS = 0
    _platform(platform, receiver)
    _, order = _order(agent, tea)
    endpoint = WebhookEndpoint.objects.filter(kind=EndpointKind.ACP)
    _pump(lambda: endpoint.filter(enabled=False).exists())
    stored = endpoint.get()
    assert stored.disabled_reason.startswith("every delivery failed")
    assert stored in endpoints_disabled_by_failures()  # the console's queue: its owner told
    assert WebhookDelivery.objects.filter(purchase_id=order["id"]).exists()


def test_acp_has_no_retry_loop_or_post_of_its_own():
    """The order webhooks leave only through events.delivery: no module of acp POSTs or
    re-raises to have the outbox retry, and the outbox handler of the order events only
    puts a delivery."""
    from acp import handlers
    from recovery.outbox import outbox_handler_for

    root = Path(handlers.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {
            n.attr if isinstance(n, ast.Attribute) else n.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute | ast.Name)
        }
        modules = {
            (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for a in n.names
        }
        assert not names & {"post_checked", "urlopen", "DeliveryFailed"}, path
        assert not modules & {"urllib3", "requests", "httpx", "urllib.request"}, path
    handler = outbox_handler_for(OutboxCategory.ACP_ORDER_EVENT)
    assert handler is handlers._order_event_put
    source = inspect.getsource(handler)
    assert "raise" not in source and "message_delivery_create" in source


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
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()


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
    assert p.current_webhook_secret() in out.getvalue()
    assert p.current_signing_secret() in out.getvalue()
    call_command("acp_platform", platform[0].name, "--no-signing", stdout=StringIO())
    p.refresh_from_db()
    assert p.current_signing_secret() == "" and p.current_webhook_secret()
    # Its order webhooks are the events app's deliveries: one `acp` endpoint at that URL,
    # turned off with the URL and on again with a new one; never the storefront API's.
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.kind, endpoint.url, endpoint.enabled) == (
        EndpointKind.ACP,
        "https://platform.example/acp/events",
        True,
    )
    call_command("acp_platform", platform[0].name, "--webhook-url", "", stdout=StringIO())
    endpoint.refresh_from_db()
    assert not endpoint.enabled and "no order webhooks" in endpoint.disabled_reason
    call_command(
        "acp_platform", platform[0].name, "--webhook-url", "https://p2.example/h", stdout=out
    )
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.url == "https://p2.example/h"
    assert WebhookEndpoint.objects.count() == 1
    from events.selectors import endpoints_for_client

    assert endpoints_for_client(platform[0].pk) == []


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

    platform_for(platform[0], receiver)
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
    _pump(lambda: _settled() and not events.filter(processed_at__isnull=True).exists())
    ids = [h["Request-Id"] for h, _ in receiver.received]
    assert ids[:2] == [f"evt_{pid}_paid", f"evt_{pid}_paid_2"]
    assert len(set(ids)) == len(ids)  # one delivery per event (it answered 200 at once)


def test_a_platform_url_that_resolves_to_a_private_address_is_refused_at_send(
    agent, platform, tea, receiver, settings
):
    """The order webhooks go through the storefront webhooks' transport: the platform's
    URL is checked at send time, like an endpoint's (a platform saved while the address was
    allowed, then refused: nothing reaches it, the delivery log keeps the refusal)."""
    receiver.status = 200
    _platform(platform, receiver)
    settings.WEBHOOK_ALLOW_LOOPBACK = False
    _, order = _order(agent, tea)
    deliveries = WebhookDelivery.objects.filter(purchase_id=order["id"])
    _pump(lambda: deliveries.filter(attempts__gte=2).exists())
    assert receiver.received == []
    assert not deliveries.filter(state=DeliveryState.DELIVERED).exists()
    assert "refused" in deliveries.filter(attempts__gte=2).first().last_error
    assert not OutboxMessage.objects.filter(
        category=OutboxCategory.ACP_ORDER_EVENT, processed_at__isnull=True
    ).exists()


@pytest.fixture
def worker_env(monkeypatch):
    # The worker is another process, started after this: it reads these from its
    # environment.
    monkeypatch.setenv("WEBHOOK_ALLOW_LOOPBACK", "true")
    monkeypatch.setenv("WEBHOOK_RETRY_SCHEDULE_SECONDS", "0.2,0.5,1")


def test_a_worker_delivers_every_order_event_once_after_failures(
    agent, platform, tea, receiver, worker_env, celery_worker
):
    """Nothing driven from the test process: the worker's relay hands each order event
    over, the delivery task sends it, the failures are retried on the delivery schedule."""
    _platform(platform, receiver)
    receiver.status = 500

    _, order = _order(agent, tea)
    pid = order["id"]
    deliveries = WebhookDelivery.objects.filter(purchase_id=pid)

    def failed_twice() -> bool:
        return WebhookAttempt.objects.filter(delivery__purchase_id=pid).count() >= 2

    wait_for(failed_twice, timeout=60)
    assert WebhookAttempt.objects.filter(status_code=500).count() >= 2  # the receiver's
    receiver.status = 200

    def all_there() -> bool:
        handed = OutboxMessage.objects.filter(
            category=OutboxCategory.ACP_ORDER_EVENT, payload__purchase=pid
        )
        return (
            handed.filter(payload__status="completed").exists()
            and not handed.filter(processed_at__isnull=True).exists()
            and deliveries.count() == handed.count()
            and not deliveries.exclude(state=DeliveryState.DELIVERED).exists()
        )

    wait_for(all_there, timeout=90)
    ids = set(deliveries.values_list("message_id", flat=True))
    assert receiver.accepted == {rid: 1 for rid in ids}  # each event once
    assert receiver.bad_signatures == 0
    assert deliveries.get(message_id=f"evt_{pid}_paid").attempts >= 3
