"""Storefront events fixtures: a receiver that verifies with the stock `standardwebhooks`
verifier, and a storefront allowed to manage its webhook endpoints."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.api.conftest import ALL_SCOPES, Api
from tests.factories import make_client


class Receiver:
    """A storefront's webhook receiver. Verifies every request with the package's own
    `Webhook.verify` against the secrets it knows; keeps what it accepted, deduplicated by
    `webhook-id` as the spec tells receivers to. `script` is a list of what to do with the
    next requests: an HTTP status, or "hang" (answer after the sender's read timeout)."""

    def __init__(self) -> None:
        self.secrets: list[str] = []
        self.script: list[int | str] = []
        self.accepted: dict[str, dict] = {}  # webhook-id -> event (first arrival)
        self.arrivals: list[str] = []  # webhook-id of every verified request, in order
        self.duplicates = 0
        self.rejected = 0
        self.requests = 0
        self.hang_seconds = 2.0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.requests += 1
                    action = receiver.script.pop(0) if receiver.script else 200
                if action == "hang":
                    time.sleep(receiver.hang_seconds)
                    action = 200  # too late: the sender has given up on this attempt
                elif action != 200:
                    self.send_response(int(action))
                    self.end_headers()
                    return
                event = receiver.verify(dict(self.headers), body)
                self.send_response(204 if event is not None else 400)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/verity"

    def verify(self, headers: dict, body: bytes) -> dict | None:
        for secret in self.secrets:
            try:
                event = Webhook(secret).verify(body, headers)
            except WebhookVerificationError:
                continue
            msg_id = {k.lower(): v for k, v in headers.items()}["webhook-id"]
            with self.lock:
                self.arrivals.append(msg_id)
                if msg_id in self.accepted:
                    self.duplicates += 1
                else:
                    self.accepted[msg_id] = event
            return event
        with self.lock:
            self.rejected += 1
        return None

    def events(self) -> list[dict]:
        return list(self.accepted.values())

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def loopback_allowed(settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    settings.EVENTS_FEED_SETTLE_SECONDS = 0
    settings.WEBHOOK_RETRY_SCHEDULE_SECONDS = [0.05, 0.1, 0.2]
    settings.WEBHOOK_READ_TIMEOUT_SECONDS = 0.5
    settings.WEBHOOK_CONNECT_TIMEOUT_SECONDS = 0.5
    return settings


@pytest.fixture
def worker_env(monkeypatch, loopback_allowed):
    # A worker is another process: it reads these from its environment.
    monkeypatch.setenv("WEBHOOK_ALLOW_LOOPBACK", "true")
    monkeypatch.setenv("WEBHOOK_RETRY_SCHEDULE_SECONDS", "0.2,0.5,1")
    monkeypatch.setenv("EVENTS_FEED_SETTLE_SECONDS", "0")


@pytest.fixture
def shop(db):
    client, key = make_client(
        scopes=(*ALL_SCOPES, "webhooks:manage"),
        limit=10_000_000,
        name="shop",
        auto_refund_limit=100_000,
    )
    return Api(key, client)


def body_of(response) -> dict:
    return json.loads(response.content)
