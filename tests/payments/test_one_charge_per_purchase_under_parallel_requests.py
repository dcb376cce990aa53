"""One purchase, one charge, whatever storefronts send at once over real HTTP (a live
server, one connection per request), in both payment modes: one key sent many times, many
keys, varied amounts. One operation, one PaymentIntent, one charge; every answer under the
shared key names that operation; the losers leave no operation, hold, event or fan-out.
Counted at localstripe over plain HTTP and in raw rows."""

from __future__ import annotations

import uuid

import pytest
import requests

from payments import services
from payments.enums import Outcome
from payments.models import Hold, IdempotencyRecord, PaymentOperation
from tests.api.client import Api
from tests.events.event_judge import orphan_events, orphan_fanout, violations
from tests.factories import ProductFactory, make_client
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["two_step", "one_call"])
def pay_mode(request, localstripe, settings):
    from tests.localstripe import one_call_off, one_call_on

    if request.param == "one_call":
        one_call_on(localstripe, settings)
        yield request.param
        one_call_off(localstripe)
    else:
        one_call_off(localstripe)
        yield request.param


def test_parallel_payments_of_one_purchase_charge_once(
    pay_mode, live_server, localstripe, send_at_once
):
    client, key = make_client(limit=10_000_000)
    shop = Api(key, client)
    pid = shop.new_purchase(ProductFactory(price=1500).sku)["id"]
    url = f"{live_server.url}/api/v1/purchases/{pid}/payments"
    shared = str(uuid.uuid4())
    body = {"payment_method": "pm_card_visa", "capture": "automatic"}

    def send(k, b):
        return requests.post(
            url,
            json=b,
            headers={"Authorization": f"Api-Key {key}", "Idempotency-Key": k},
            timeout=30,
        )

    sends = [lambda: send(shared, body) for _ in range(4)]
    sends += [lambda: send(str(uuid.uuid4()), body) for _ in range(3)]
    sends += [lambda: send(str(uuid.uuid4()), {**body, "amount": 1500, "currency": "usd"})]
    sends += [lambda: send(str(uuid.uuid4()), {**body, "currency": "usd"})]
    answers = send_at_once(sends)
    codes = [getattr(a, "status_code", repr(a)) for a in answers]
    print(pay_mode, codes)
    assert not [a for a in answers if isinstance(a, Exception)], answers
    assert all(c in (200, 201, 202, 409, 422) for c in codes), [
        (a.status_code, a.text[:200]) for a in answers
    ]
    ops = list(PaymentOperation.objects.filter(purchase_id=pid))
    assert len(ops) == 1, [(o.id, o.outcome) for o in ops]
    op = ops[0]
    for _ in range(3):
        op = PaymentOperation.objects.get(id=op.id)
        if op.outcome in (Outcome.SUCCEEDED, Outcome.FAILED):
            break
        if op.outcome == Outcome.PENDING:
            services.operation_dispatch(operation_id=op.id)
        else:
            services.operation_reconcile(operation_id=op.id)
    op = PaymentOperation.objects.get(id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    intents = localstripe.payment_intents_for(pid)
    assert len(intents) == 1 and intents[0]["status"] == "succeeded", intents
    charges = [
        c for c in localstripe.list("charges") if c.get("payment_intent") == intents[0]["id"]
    ]
    assert len(charges) == 1
    created = [a for a in answers if a.status_code in (201, 202)]
    assert len(created) == 1, codes  # one request made the operation
    for a in answers[:4]:
        if a.status_code in (200, 201, 202):
            assert a.json()["id"] == op.id, a.json()
    assert Hold.objects.count() == 1
    records = IdempotencyRecord.objects.filter(resource_id=op.id)
    assert records.count() == 1, list(records.values("key", "state"))
    settle_outbox()
    assert orphan_events() == [] and orphan_fanout() == []
    assert violations(pid) == []
