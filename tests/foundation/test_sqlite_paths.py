"""Every raw SQL statement Verity runs also works on the embedded default (SQLite, as
`make run` uses it): the duplicate-safe webhook insert, the idempotency-key claim, the
storefront events' numbering and the halt insert are each one `INSERT … ON CONFLICT …
RETURNING`, which PostgreSQL (the rest of the suite) and SQLite >= 3.35 both parse. The
suite's database is PostgreSQL, so this runs Verity's own services in a subprocess on a
fresh SQLite file under a temporary var/ (the same settings `make run` reads)."""

from __future__ import annotations

SCRIPT = r"""
import sqlite3, time
from datetime import timedelta
from django.db import connection
from django.utils import timezone
from payments.clients import SCOPES, api_client_create
from payments.api.idempotency import idempotency_claim
from payments.models import IdempotencyRecord
from payments.api.problems import Problem
from recovery.halts import halt_set
from recovery.models import OutboxMessage, WorkflowHalt
from webhooks.models import ProviderEvent
from webhooks.services import event_ingest

assert connection.vendor == "sqlite", connection.vendor
event = {"id": "evt_sqlite_1", "object": "event", "type": "payment_intent.succeeded",
         "created": int(time.time()), "livemode": False,
         "data": {"object": {"id": "pi_sqlite", "object": "payment_intent",
                             "status": "succeeded", "amount": 1250, "currency": "usd",
                             "metadata": {"purchase_id": "pur_sqlite"}}}}
# the webhook insert: new, then a duplicate that writes nothing
assert event_ingest(event=event) is True
assert event_ingest(event=event) is False
assert ProviderEvent.objects.filter(event_id="evt_sqlite_1").count() == 1
assert OutboxMessage.objects.filter(dedupe_key="event:evt_sqlite_1").count() == 1
stored = ProviderEvent.objects.get(event_id="evt_sqlite_1")
assert stored.payload["data"]["object"]["id"] == "pi_sqlite", stored.payload
assert stored.purchase_id == "pur_sqlite"
# datetimes stored as the ORM stores them, so range filters see them
recent = timezone.now() - timedelta(minutes=1)
assert ProviderEvent.objects.filter(received_at__gte=recent).count() == 1
# the idempotency claim: first claims, the same key again is in flight (409)
client, _ = api_client_create(name="sqlite", scopes=list(SCOPES))
claim = idempotency_claim(api_client=client, route="r", key="k1", path="/p", body={"a": 1})
assert not claim.replay
try:
    idempotency_claim(api_client=client, route="r", key="k1", path="/p", body={"a": 1})
except Problem as exc:
    assert exc.status == 409, exc.status
else:
    raise AssertionError("a second claim of an in-flight key was not refused")
assert IdempotencyRecord.objects.filter(lease_until__gt=timezone.now()).count() == 1
# storefront events: numbered by the counter's upsert, one by one (the purchase's
# creation) and a change's batch (two more, written together with one view)
from django.db import transaction
from events.models import Event, EventType
from events.record import event_batch, event_record
from payments import services
from payments.models import Product
from recovery.outbox import outbox_batch
Product.objects.create(sku="SQLITE-1", name="Lamp", price=1250, currency="usd", stock=5)
quote = services.quote_create(api_client=client, items=[{"sku": "SQLITE-1", "quantity": 1}],
                              currency="usd")
purchase = services.purchase_create(api_client=client, quote_id=quote.id,
                                    quote_version=quote.version, customer_reference="c-1")
with transaction.atomic(), outbox_batch(), event_batch():
    for n in (1, 2):
        event_record(purchase_id=purchase.id, event_type=EventType.PURCHASE_STATUS_CHANGED,
                     change={"n": n})
written = list(Event.objects.filter(purchase_id=purchase.id).order_by("id"))
assert [(e.sequence, e.data.get("n")) for e in written] == [(1, None), (2, 1), (3, 2)], [
    (e.sequence, e.data) for e in written]
assert written[1].data["purchase"] == written[2].data["purchase"]
assert written[2].data["purchase"]["id"] == purchase.id
for e in written:
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{e.id}").count() == 1, e.id
# the halt insert: set once, setting again is a no-op
halt_set(name="checkout", reason="sqlite check", actor="test")
halt_set(name="checkout", reason="sqlite check", actor="test")
assert WorkflowHalt.objects.filter(name="checkout", created_at__gte=recent).count() == 1
# /metrics on SQLite: every database gauge collects (no PostgreSQL-only SQL: the
# collector's own error guard is bypassed so a failure shows), and the final results of
# stored events are counted exactly here (PostgreSQL estimates them from its statistics)
from recovery.metrics import DatabaseCollector
ProviderEvent.objects.filter(event_id="evt_sqlite_1").update(result="applied")
families = {f.name: f for f in DatabaseCollector()._collect()}
assert "verity_unknown_operations" in families, sorted(families)
events = {s.labels["result"]: s.value for s in families["verity_webhook_events"].samples}
assert (events["applied"], events["ignored"], events["pending"]) == (1, 0, 0), events
# the webhook over HTTP, as a delivery arrives (answered by config.early_webhook): stored
# once, and a redelivery is a duplicate
import hashlib, hmac, json
from django.test import Client
body = json.dumps({**event, "id": "evt_sqlite_http"}).encode()
ts = int(time.time())
mac = hmac.new(b"whsec_sqlite", f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
answers = [Client().post("/webhooks/stripe/", data=body, content_type="application/json",
                         HTTP_STRIPE_SIGNATURE=f"t={ts},v1={mac}") for _ in range(2)]
assert [(a.status_code, a.json()["duplicate"]) for a in answers] == [
    (200, False), (200, True)], [a.content for a in answers]
assert ProviderEvent.objects.filter(event_id="evt_sqlite_http").count() == 1
assert OutboxMessage.objects.filter(dedupe_key="event:evt_sqlite_http").count() == 1
print("SQLITE PATHS OK", sqlite3.sqlite_version)
"""


def test_raw_sql_paths_work_on_sqlite(embedded_sqlite):
    embedded_sqlite.env.update(STRIPE_WEBHOOK_SECRETS="whsec_sqlite", ALLOWED_HOSTS="testserver")

    out = embedded_sqlite.shell(SCRIPT)

    assert "SQLITE PATHS OK" in out
    assert (embedded_sqlite.var / "verity.sqlite3").exists()
