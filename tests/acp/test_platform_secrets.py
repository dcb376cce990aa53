"""An agent platform's secrets (the one signing the order webhooks Verity sends it, the one
its own requests are signed with) are derived from the environment's key and a salt on the
row, shown once by `acp_platform` and nowhere else: no column holds one, the shown secret
verifies the bytes actually delivered and signs requests that are accepted, a rotated one
stops working, and a platform that had a stored secret keeps it until it is rotated."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from acp.models import AgentPlatform, CheckoutSession
from acp.views import request_signature
from events.delivery import deliveries_send_due
from events.models import DeliveryState, WebhookDelivery
from recovery.models import OutboxMessage
from recovery.relay import relay_drain_once
from tests.acp.agent import complete_body, new_email
from tests.acp.tokens import issue_spt
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SHOWN = re.compile(r"(webhook|request signing) secret \(shown once\): (\S+)")


class Recorder:
    """The platform's webhook endpoint: keeps every request's headers and raw body and
    answers 200; the test verifies the signatures itself."""

    def __init__(self) -> None:
        self.received: list[tuple[dict, bytes]] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with recorder.lock:
                    recorder.received.append((dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/acp/order_events"


@pytest.fixture
def recorder(settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    settings.WEBHOOK_RETRY_SCHEDULE_SECONDS = [0.05, 0.1, 0.2]
    r = Recorder()
    yield r
    r.server.shutdown()


def _command(*args: str) -> tuple[str, dict[str, str]]:
    """Run acp_platform; its output and the secrets it showed, by kind."""
    out, err = StringIO(), StringIO()
    call_command("acp_platform", *args, stdout=out, stderr=err)
    assert err.getvalue() == ""
    text = out.getvalue()
    return text, {kind: secret for kind, secret in SHOWN.findall(text)}


def _raw_rows(table: str) -> list[str]:
    """Every value of every row of `table`, as the database holds it."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 (a fixed table name)
        return [str(value) for row in cursor.fetchall() for value in row]


def _merchant_signature_verifies(secret: str, headers: dict, body: bytes) -> bool:
    t, v1 = (part.split("=", 1)[1] for part in headers["Merchant-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(v1, expected)


def _signed(secret: str, body: dict | None) -> dict[str, str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"Timestamp": now, "Signature": request_signature(secret, now, body)}


def _create_body(sku: str) -> dict:
    return {"line_items": [{"id": sku, "quantity": 1}], "currency": "usd", "capabilities": {}}


def _delivered(recorder: Recorder, purchase_id: str) -> list[tuple[dict, bytes]]:
    """Hand the order events over and send them until everything due is delivered and the
    purchase's events reached the platform: what it received about that purchase."""

    def settled():
        relay_drain_once()
        deliveries_send_due()
        now = timezone.now()
        with recorder.lock:
            mine = [(h, b) for h, b in recorder.received if purchase_id.encode() in b]
        pending = WebhookDelivery.objects.exclude(state=DeliveryState.DELIVERED).exists()
        due = OutboxMessage.objects.filter(processed_at__isnull=True, available_at__lte=now)
        return mine if mine and not pending and not due.exists() else None

    return wait_for(settled, timeout=30)


def _paid_order(agent, tea, signing_secret: str) -> str:
    """A signed create and a signed complete: the purchase id of the paid order."""
    body = _create_body(tea.sku)
    r = agent.post("checkout_sessions", body, **_signed(signing_secret, body))
    assert r.status_code == 201, r.text
    complete = complete_body(issue_spt(1250), new_email())
    r = agent.post(
        f"checkout_sessions/{r.json()['id']}/complete",
        complete,
        **_signed(signing_secret, complete),
    )
    assert r.status_code == 200, r.text
    return r.json()["order"]["id"]


def test_no_platform_column_holds_a_secret_it_was_given(platform):
    _, shown = _command(
        platform[0].name,
        "--webhook-url",
        "https://platform.example/acp/events",
        "--new-signing-secret",
    )
    assert set(shown) == {"webhook", "request signing"}
    row = _raw_rows("acp_agentplatform")
    for secret in shown.values():
        assert not [value for value in row if secret in value]
    _, rotated = _command(platform[0].name, "--new-webhook-secret", "--new-signing-secret")
    assert set(rotated) == {"webhook", "request signing"}
    assert not set(rotated.values()) & set(shown.values())
    row = _raw_rows("acp_agentplatform")
    for secret in [*shown.values(), *rotated.values()]:
        assert not [value for value in row if secret in value]
        assert not [value for value in _raw_rows("events_webhookendpoint") if secret in value]
    # Run again without a rotation: nothing is shown a second time.
    text, again = _command(platform[0].name)
    assert again == {} and not [s for s in rotated.values() if s in text]
    assert "signing=on" in text


def test_the_shown_secrets_sign_what_is_sent_and_what_is_accepted(
    agent,
    platform,
    tea,
    recorder,
    caplog,
    login,  # noqa: F811
):
    caplog.set_level(logging.DEBUG)
    _, first = _command(platform[0].name, "--webhook-url", recorder.url, "--new-signing-secret")
    answers: list[str] = []

    # A request signed with the shown secret is accepted; the webhook it leads to carries a
    # Merchant-Signature the shown webhook secret verifies over the bytes received.
    pid = _paid_order(agent, tea, first["request signing"])
    for headers, body in _delivered(recorder, pid):
        assert _merchant_signature_verifies(first["webhook"], headers, body)

    # Rotated: the old request secret is refused, before anything is written; the new one
    # is accepted, and the next webhooks verify with the new webhook secret only.
    _, second = _command(platform[0].name, "--new-webhook-secret", "--new-signing-secret")
    body = _create_body(tea.sku)
    sessions = CheckoutSession.objects.count()
    r = agent.post("checkout_sessions", body, **_signed(first["request signing"], body))
    answers.append(r.text + str(dict(r.headers)))
    assert (r.status_code, r.json()["code"]) == (401, "invalid_signature")
    assert CheckoutSession.objects.count() == sessions
    pid2 = _paid_order(agent, tea, second["request signing"])
    for headers, body in _delivered(recorder, pid2):
        assert _merchant_signature_verifies(second["webhook"], headers, body)
        assert not _merchant_signature_verifies(first["webhook"], headers, body)

    # Shown once: not in any answer, log line, console page or stored row.
    r = agent.get(f"checkout_sessions/{CheckoutSession.objects.latest('created_at').id}")
    answers.append(r.text + str(dict(r.headers)))  # unsigned: refused, says why
    for role in ("support", "operator"):
        page = login(role).get(reverse("support:webhooks") + f"?purchase={pid2}")
        assert page.status_code == 200
        answers.append(page.content.decode())
    logged = "\n".join(record.getMessage() for record in caplog.records) + caplog.text
    stored = _raw_rows("acp_agentplatform") + _raw_rows("events_webhookendpoint")
    stored += _raw_rows("events_webhookdelivery") + _raw_rows("support_auditentry")
    for secret in [*first.values(), *second.values()]:
        assert secret not in logged
        assert not [a for a in answers if secret in a]
        assert not [value for value in stored if secret in value]


def _insert_platform_as_before(api_client_id: int, url: str, webhook: str, signing: str) -> None:
    """A platform row written by the code before derived secrets: both stored in clear."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO acp_agentplatform"
            " (api_client_id, webhook_url, webhook_secret, signing_secret, created_at)"
            " VALUES (%s, %s, %s, %s, now())",
            [api_client_id, url, webhook, signing],
        )


def test_a_stored_secret_keeps_working_after_migrating_until_it_is_rotated(
    agent, platform, tea, recorder
):
    from acp.checks import platforms_with_stored_secrets

    old_webhook, old_signing = "whsec_stored_before", "sigsec_stored_before"
    try:
        call_command("migrate", "acp", "0001_checkout_sessions_and_platforms", verbosity=0)
        _insert_platform_as_before(platform[0].pk, recorder.url, old_webhook, old_signing)
    finally:
        call_command("migrate", "acp", verbosity=0)
    stored = AgentPlatform.objects.get(api_client=platform[0])
    assert (stored.legacy_webhook_secret, stored.legacy_signing_secret) == (
        old_webhook,
        old_signing,
    )
    # The operator is told at deploy which platforms still have a stored secret.
    warnings = platforms_with_stored_secrets(databases=["default"])
    assert [w.level for w in warnings] == [checks.WARNING]
    # Registered: what `migrate` and `check --database default` run.
    assert warnings[0].id in [m.id for m in checks.run_checks(databases=["default"])]
    assert platform[0].name in warnings[0].msg
    assert "webhook" in warnings[0].msg and "request signing" in warnings[0].msg
    assert old_webhook not in warnings[0].msg + str(warnings[0].hint)

    # Unchanged for the platform: its stored secrets still sign and verify.
    pid = _paid_order(agent, tea, old_signing)
    for headers, body in _delivered(recorder, pid):
        assert _merchant_signature_verifies(old_webhook, headers, body)

    # Rotated with acp_platform: the stored values are gone, the derived ones work.
    text, shown = _command(platform[0].name, "--new-webhook-secret", "--new-signing-secret")
    stored.refresh_from_db()
    assert (stored.legacy_webhook_secret, stored.legacy_signing_secret) == ("", "")
    assert platforms_with_stored_secrets(databases=["default"]) == []
    for value in _raw_rows("acp_agentplatform"):
        assert old_webhook not in value and old_signing not in value
        assert shown["webhook"] not in value and shown["request signing"] not in value
    body = _create_body(tea.sku)
    r = agent.post("checkout_sessions", body, **_signed(old_signing, body))
    assert (r.status_code, r.json()["code"]) == (401, "invalid_signature")
    pid2 = _paid_order(agent, tea, shown["request signing"])
    for headers, body in _delivered(recorder, pid2):
        assert _merchant_signature_verifies(shown["webhook"], headers, body)
        assert not _merchant_signature_verifies(old_webhook, headers, body)


def test_only_one_stored_secret_rotated_leaves_the_other_in_use_and_listed(platform):
    from acp.checks import platforms_with_stored_secrets

    try:
        call_command("migrate", "acp", "0001_checkout_sessions_and_platforms", verbosity=0)
        _insert_platform_as_before(platform[0].pk, "https://p.example/h", "whsec_old", "sig_old")
    finally:
        call_command("migrate", "acp", verbosity=0)
    _command(platform[0].name, "--new-webhook-secret")
    stored = AgentPlatform.objects.get(api_client=platform[0])
    assert (stored.legacy_webhook_secret, stored.legacy_signing_secret) == ("", "sig_old")
    assert stored.current_signing_secret() == "sig_old"
    (warning,) = platforms_with_stored_secrets(databases=["default"])
    assert "request signing" in warning.msg and "webhook" not in warning.msg.split(":", 1)[1]
    # Turning request signing off also forgets the stored one.
    _command(platform[0].name, "--no-signing")
    stored.refresh_from_db()
    assert stored.legacy_signing_secret == "" and stored.current_signing_secret() == ""
    assert platforms_with_stored_secrets(databases=["default"]) == []


def test_migrating_back_gives_the_code_before_the_same_secrets(platform):
    _, shown = _command(
        platform[0].name, "--webhook-url", "https://p.example/h", "--new-signing-secret"
    )
    try:
        call_command("migrate", "acp", "0001_checkout_sessions_and_platforms", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT webhook_secret, signing_secret FROM acp_agentplatform")
            assert cursor.fetchall() == [(shown["webhook"], shown["request signing"])]
    finally:
        call_command("migrate", "acp", verbosity=0)
