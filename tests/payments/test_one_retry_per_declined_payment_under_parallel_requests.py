"""The deliberate retry of a declined payment sent many times at once over real HTTP, with
different keys, in both payment modes: one retry operation (retry_of is unique), one
charge; the refused ones leave no operation, hold, event or fan-out (the retry is created,
and in one-call mode claimed, in the keyed transaction without a savepoint)."""

from __future__ import annotations

import threading
import uuid

import pytest
import requests
from django.db import connection

from payments import services
from payments.enums import Outcome
from payments.models import Hold, PaymentOperation
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


def test_parallel_retries_of_a_decline_make_one_retry(pay_mode, live_server, localstripe):
    client, key = make_client(limit=10_000_000)
    shop = Api(key, client)
    pid = shop.new_purchase(ProductFactory(price=1500).sku)["id"]
    declined = shop.pay(pid, method="pm_card_chargeDeclined")
    assert declined.status_code == 402, declined.content
    failed = PaymentOperation.objects.get(purchase_id=pid)
    answers: list = [None] * 5
    barrier = threading.Barrier(5)

    def retry(i):
        try:
            barrier.wait(10)
            answers[i] = requests.post(
                f"{live_server.url}/api/v1/purchases/{pid}/payments",
                json={
                    "payment_method": "pm_card_visa",
                    "capture": "automatic",
                    "retry_of": failed.id,
                },
                headers={"Authorization": f"Api-Key {key}", "Idempotency-Key": str(uuid.uuid4())},
                timeout=30,
            )
        except Exception as exc:  # noqa: BLE001
            answers[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=retry, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    codes = [getattr(a, "status_code", repr(a)) for a in answers]
    print(pay_mode, codes, [a.json().get("code") for a in answers if a.status_code >= 400])
    retries = list(PaymentOperation.objects.filter(purchase_id=pid, retry_of=failed))
    assert len(retries) == 1, [(o.id, o.outcome) for o in retries]
    op = retries[0]
    for _ in range(3):
        op = PaymentOperation.objects.get(id=op.id)
        if op.outcome in (Outcome.SUCCEEDED, Outcome.FAILED):
            break
        if op.outcome == Outcome.PENDING:
            services.operation_dispatch(operation_id=op.id)
        else:
            services.operation_reconcile(operation_id=op.id)
    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.SUCCEEDED
    paid = localstripe.succeeded_charges_for(pid)
    assert len(paid) == 1, paid
    assert PaymentOperation.objects.filter(purchase_id=pid).count() == 2
    assert Hold.objects.filter(state="reserved").count() == 0
    settle_outbox()
    assert orphan_events() == [] and orphan_fanout() == []
    assert violations(pid) == []
