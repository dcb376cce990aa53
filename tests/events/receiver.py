"""A storefront's webhook receiver on loopback, verifying with the stock
`standardwebhooks` verifier."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


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
