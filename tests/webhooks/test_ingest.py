"""Ingestion: verify, insert once, one outbox row; refuse and write nothing otherwise."""

import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from recovery.models import OutboxCategory, OutboxMessage
from webhooks.models import EventResult, ProviderEvent

from .events import OLD_SECRET, SECRET, event_for, intent_object, post, sign


def statements(queries) -> list[str]:
    # SAVEPOINT/RELEASE come from the test's wrapping transaction, not from the view.
    verbs = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    return [v for v in verbs if v not in ("SAVEPOINT", "RELEASE")]


def metric(result: str) -> float:
    return REGISTRY.get_sample_value("verity_webhook_results_total", {"result": result}) or 0.0


def a_succeeded_event(**kw):
    return event_for(
        intent_object(
            pi_id="pi_ingest",
            status="succeeded",
            amount=1500,
            metadata={"purchase_id": "pur_x", "operation_id": "op_x", "customer_reference": "c-1"},
        ),
        "payment_intent.succeeded",
        **kw,
    )


def assert_nothing_written(event_id: str = "evt_"):
    # (by id: a later test run must not be confused by a stray delivery of another test)
    assert ProviderEvent.objects.filter(event_id__startswith=event_id).count() == 0
    assert OutboxMessage.objects.filter(dedupe_key__startswith=f"event:{event_id}").count() == 0


@pytest.mark.django_db
def test_valid_event_is_stored_once_with_one_outbox_message(client):
    event = a_succeeded_event()
    before = metric("received")

    response = post(client, event)

    assert response.status_code == 200
    stored = ProviderEvent.objects.get(event_id=event["id"])
    assert (stored.event_id, stored.type, stored.result) == (
        event["id"],
        "payment_intent.succeeded",
        EventResult.PENDING,
    )
    assert stored.object_id == "pi_ingest" and stored.purchase_id == "pur_x"
    assert stored.account == ""  # missing account = the platform
    message = OutboxMessage.objects.get(payload={"event": stored.pk})
    assert message.category == OutboxCategory.PROCESS_EVENT
    assert message.payload == {"event": stored.pk}
    assert message.dedupe_key == f"event:{event['id']}"
    assert metric("received") == before + 1


@pytest.mark.django_db
def test_stored_payload_keeps_safe_fields_only(client):
    event = event_for(
        intent_object(
            pi_id="pi_safe",
            status="requires_payment_method",
            amount=1500,
            error_code="card_declined",
            metadata={"purchase_id": "pur_x"},
        ),
        "payment_intent.payment_failed",
        event_id=f"evt_4242{secrets.token_hex(6)}",
    )  # digits by chance, pinned

    post(client, event)

    stored = ProviderEvent.objects.get(event_id=event["id"]).payload
    assert (stored["id"], stored["created"]) == (event["id"], event["created"])
    # The random id and the clock are not card data, and may hold "4242" by chance
    # (CI saw evt_43485424293e3026): search everything else.
    text = json.dumps({k: v for k, v in stored.items() if k not in ("id", "created")})
    for secret_thing in (
        "4242",
        "0341",
        "Jane",
        "jane@example.com",
        "fingerprint",
        "exp_month",
        "client_secret",
        "_secret_",
        "billing_details",
        "declined.",
        "free text",
        "pm_card_visa",
    ):
        assert secret_thing not in text, secret_thing
    obj = stored["data"]["object"]
    assert obj["latest_charge"] == "ch_embedded"  # embedded object normalised to its id
    assert obj["last_payment_error"] == {"code": "card_declined"}
    assert obj["metadata"] == {"purchase_id": "pur_x"}
    assert set(stored) == {"id", "type", "account", "created", "data"}


@pytest.mark.django_db
def test_ingestion_is_one_insert_of_the_event_and_one_of_the_outbox_message(client):
    event = a_succeeded_event()
    body = json.dumps(event).encode()
    header = sign(body)

    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            "/webhooks/stripe/",
            data=body,
            content_type="application/json",
            HTTP_STRIPE_SIGNATURE=header,
        )

    assert response.status_code == 200
    assert statements(queries) == ["INSERT", "INSERT"], queries.captured_queries


@pytest.mark.django_db
def test_duplicate_delivery_answers_200_and_writes_nothing(client):
    event = a_succeeded_event()
    post(client, event)
    before = metric("duplicate")

    with CaptureQueriesContext(connection) as queries:
        response = post(client, event)

    assert response.status_code == 200 and response.json()["duplicate"] is True
    assert statements(queries) == ["INSERT"]  # the absorbed insert only
    assert ProviderEvent.objects.filter(event_id=event["id"]).count() == 1
    assert OutboxMessage.objects.filter(dedupe_key__startswith=f"event:{event['id']}").count() == 1
    assert metric("duplicate") == before + 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "case",
    ["forged", "wrong_secret", "missing", "stale", "body_changed", "garbage_header", "no_v1"],
)
def test_refused_signatures_answer_400_and_write_nothing(client, case):
    event = a_succeeded_event()
    body = json.dumps(event).encode()
    header = {
        "forged": f"t={int(time.time())},v1={'0' * 64}",
        "wrong_secret": sign(body, "whsec_someone_else"),
        "missing": "",
        "stale": sign(body, SECRET, ts=int(time.time()) - 301),
        "body_changed": sign(body.replace(b"1500", b"1"), SECRET),
        "garbage_header": "not a signature",
        "no_v1": f"t={int(time.time())},v0=abc",
    }[case]
    label = {"missing": "missing_signature", "stale": "stale_signature"}.get(case, "bad_signature")
    before = metric(label)

    response = post(client, body, header=header)

    assert response.status_code == 400
    assert response.json() == {"error": label}
    assert_nothing_written()
    assert metric(label) == before + 1


@pytest.mark.django_db
def test_timestamp_far_in_the_future_is_refused(client):
    response = post(client, a_succeeded_event(), ts=int(time.time()) + 3600)

    assert response.status_code == 400
    assert_nothing_written()


@pytest.mark.django_db
def test_event_signed_with_the_previous_secret_is_accepted_during_rotation(client):
    response = post(client, a_succeeded_event(), secret=OLD_SECRET)

    assert response.status_code == 200
    assert ProviderEvent.objects.count() == 1
    assert OutboxMessage.objects.filter(category=OutboxCategory.PROCESS_EVENT).count() == 1


@pytest.mark.django_db
def test_retired_secret_is_refused_after_rotation(client, settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]

    response = post(client, a_succeeded_event(), secret=OLD_SECRET)

    assert response.status_code == 400
    assert_nothing_written()


@pytest.mark.django_db
def test_signed_body_that_is_not_an_event_is_refused(client):
    body = b'{"hello": "world"}'

    response = post(client, body, header=sign(body))

    assert response.status_code == 400
    assert response.json() == {"error": "malformed"}
    assert_nothing_written()


@pytest.mark.django_db
def test_get_is_not_allowed(client):
    assert client.get("/webhooks/stripe/").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_deliveries_store_one_event_and_one_outbox_message(live_server):
    event = a_succeeded_event()
    body = json.dumps(event).encode()
    url = f"{live_server.url}/webhooks/stripe/"

    def deliver(_):
        return requests.post(
            url,
            data=body,
            timeout=15,
            headers={"Stripe-Signature": sign(body), "Content-Type": "application/json"},
        ).status_code

    with ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(deliver, range(20)))

    assert statuses == [200] * 20
    assert ProviderEvent.objects.filter(event_id=event["id"]).count() == 1
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event['id']}").count() == 1


@pytest.mark.django_db
def test_processing_results_are_counted(client):
    from webhooks.services import event_process

    event = event_for({"id": "cus_1", "object": "customer"}, "customer.created")
    post(client, event)
    before = metric("ignored")

    assert (
        event_process(event_id=ProviderEvent.objects.get(event_id=event["id"]).pk)
        == EventResult.IGNORED
    )
    assert (
        event_process(event_id=ProviderEvent.objects.get(event_id=event["id"]).pk)
        == EventResult.IGNORED
    )  # idempotent: counted once

    assert metric("ignored") == before + 1
