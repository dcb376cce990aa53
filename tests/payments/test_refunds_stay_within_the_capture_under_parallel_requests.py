"""Refunds requested at once over real HTTP, in both payment modes: many keys asking more
than the capture together, one key sent many times. The provider never returns more than
was captured, one key makes one refund, and every refund event matches a refund the
provider made. Counted at localstripe over plain HTTP."""

from __future__ import annotations

import uuid

import pytest
import requests

from payments import services
from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation
from tests.api.client import Api
from tests.events.event_judge import event_rows, violations
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


def test_parallel_refunds_never_return_more_than_the_capture(
    pay_mode, live_server, localstripe, send_at_once
):
    client, key = make_client(limit=10_000_000, auto_refund_limit=100_000)
    shop = Api(key, client)
    pid = shop.new_purchase(ProductFactory(price=1500).sku)["id"]
    assert shop.pay(pid).status_code == 201
    url = f"{live_server.url}/api/v1/purchases/{pid}/refunds"
    shared = str(uuid.uuid4())

    def send(k, amount):
        return requests.post(
            url,
            json={"amount": amount},
            headers={"Authorization": f"Api-Key {key}", "Idempotency-Key": k},
            timeout=30,
        )

    rounds = []
    for _ in range(3):
        sends = [lambda: send(shared, 600) for _ in range(3)]
        sends += [lambda: send(str(uuid.uuid4()), 600) for _ in range(4)]
        answers = send_at_once(sends)
        rounds.append([getattr(a, "status_code", repr(a)) for a in answers])
        assert not [a for a in answers if isinstance(a, Exception)], answers
        for op in PaymentOperation.objects.filter(
            purchase_id=pid, kind=OperationKind.REFUND
        ).exclude(outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED]):
            services.operation_reconcile(operation_id=op.id)
    print(pay_mode, rounds)
    settle_outbox()
    payment = PaymentOperation.objects.get(purchase_id=pid, kind=OperationKind.CHARGE)
    refunds = localstripe.refunds_for(payment.provider_reference)
    returned = sum(r["amount"] for r in refunds if r["status"] == "succeeded")
    assert returned <= 1500, refunds
    ours = PaymentOperation.objects.filter(purchase_id=pid, kind=OperationKind.REFUND)
    assert sum(o.amount for o in ours if o.outcome == Outcome.SUCCEEDED) == returned
    assert len(refunds) == ours.exclude(outcome=Outcome.FAILED).count()
    from payments.models import IdempotencyRecord

    shared_rec = IdempotencyRecord.objects.filter(key=shared)
    assert shared_rec.count() <= 1
    kinds = [e[2] for e in event_rows(pid)]
    assert kinds.count("refund.succeeded") == len(
        [r for r in refunds if r["status"] == "succeeded"]
    )
    assert violations(pid) == []
