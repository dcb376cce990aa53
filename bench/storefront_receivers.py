"""Storefront webhook receivers for the soak: one that answers, one that fails, one that
times out (while the run's faults are on), each verifying every request with the stock
`standardwebhooks` verifier and deduplicating on `webhook-id`, as the spec tells receivers.

The judge after the drain reads the receiver's own record (what arrived, verified) against
the delivery rows: a delivery marked delivered whose event never reached the receiver, or
a request whose signature does not verify, is a violation. Nothing of events/ is called.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

# name -> (share of requests failed with a 5xx, share held past the sender's read timeout)
KINDS = {"steady": (0.0, 0.0), "failing": (0.4, 0.0), "hanging": (0.0, 0.3)}
HANG_SECONDS = 2.5  # the soak sets WEBHOOK_READ_TIMEOUT_SECONDS below this


class StorefrontReceiver:
    def __init__(self, kind: str, seed: int) -> None:
        self.kind = kind
        self.fail_share, self.hang_share = KINDS[kind]
        self.rng = random.Random(seed)
        self.chaos = True  # off for the drain: every receiver answers then
        self.secret = ""
        self.endpoint_id = ""
        self.accepted: set[str] = set()
        self.requests = self.failed = self.hung = self.duplicates = self.rejected = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests += 1
                    roll = receiver.rng.random()
                    chaos = receiver.chaos
                if chaos and roll < receiver.fail_share:
                    with receiver.lock:
                        receiver.failed += 1
                    self.send_response(503)
                    self.end_headers()
                    return
                if chaos and roll < receiver.hang_share:
                    with receiver.lock:
                        receiver.hung += 1
                    time.sleep(HANG_SECONDS)  # the sender gave up; this answer is lost
                ok = receiver.take(dict(self.headers), body)
                self.send_response(204 if ok else 400)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/{kind}"

    def take(self, headers: dict, body: bytes) -> bool:
        try:
            Webhook(self.secret).verify(body, headers)
        except (WebhookVerificationError, ValueError):
            with self.lock:
                self.rejected += 1
            return False
        msg_id = {k.lower(): v for k, v in headers.items()}["webhook-id"]
        with self.lock:
            if msg_id in self.accepted:
                self.duplicates += 1
            self.accepted.add(msg_id)
        return True

    def register(self, api) -> None:
        """The endpoint, made through the REST API with an Idempotency-Key (retried with the
        same key until it answers: one endpoint however many tries)."""
        key = f"soak-endpoint-{self.kind}-{uuid.uuid4().hex[:8]}"
        for _ in range(20):
            r = api.call(
                "POST",
                "/api/v1/webhook-endpoints",
                {"url": self.url, "description": f"soak {self.kind}"},
                key=key,
            )
            if r is not None and r.status_code in (200, 201):
                made = r.json()
                self.secret, self.endpoint_id = made["secret"], made["endpoint"]["id"]
                return
            time.sleep(1)
        raise RuntimeError(f"could not make the {self.kind} webhook endpoint")

    def close(self) -> None:
        self.server.shutdown()


def judge(receivers: list[StorefrontReceiver]) -> tuple[list[dict], list[str]]:
    """Per receiver: its own figures, and the deliveries the database calls delivered whose
    event the receiver never verified (read from the rows, compared with the receiver)."""
    from events.models import WebhookDelivery

    rows, violations = [], []
    for r in receivers:
        delivered = set(
            WebhookDelivery.objects.filter(
                endpoint_id=r.endpoint_id, state="delivered"
            ).values_list("event__public_id", flat=True)
        )
        owed = WebhookDelivery.objects.filter(endpoint_id=r.endpoint_id).count()
        unseen = delivered - r.accepted
        rows.append(
            {
                "receiver": r.kind,
                "deliveries": owed,
                "delivered": len(delivered),
                "verified_unique": len(r.accepted),
                "requests": r.requests,
                "failed_on_purpose": r.failed,
                "held_past_timeout": r.hung,
                "duplicates_deduped": r.duplicates,
                "bad_signatures": r.rejected,
            }
        )
        if unseen:
            violations.append(
                f"{r.kind} receiver: {len(unseen)} deliveries marked delivered "
                f"never verified there (e.g. {sorted(unseen)[:3]})"
            )
        if r.rejected:
            violations.append(f"{r.kind} receiver: {r.rejected} requests failed verification")
    return rows, violations
