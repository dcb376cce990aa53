"""A client's spending limit under parallel payments of its different purchases over real
HTTP, in both payment modes: what the provider charged never exceeds the limit, and every
hold left matches a payment that is still open or consumed one that succeeded. Counted at
localstripe over plain HTTP."""

from __future__ import annotations

import functools
import uuid

import pytest
import requests

from payments import services
from payments.enums import HoldState, Outcome
from payments.models import Hold, PaymentOperation
from tests.api.client import Api
from tests.factories import ProductFactory, make_client

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


def test_parallel_payments_never_charge_past_the_limit(
    pay_mode, live_server, localstripe, send_at_once
):
    client, key = make_client(limit=4000, name="limited")
    shop = Api(key, client)
    pids = [shop.new_purchase(ProductFactory(price=1500).sku)["id"] for _ in range(6)]

    def pay(pid):
        return requests.post(
            f"{live_server.url}/api/v1/purchases/{pid}/payments",
            json={"payment_method": "pm_card_visa", "capture": "automatic"},
            headers={"Authorization": f"Api-Key {key}", "Idempotency-Key": str(uuid.uuid4())},
            timeout=30,
        )

    answers = send_at_once([functools.partial(pay, pid) for pid in pids])
    codes = [getattr(a, "status_code", repr(a)) for a in answers]
    for op in PaymentOperation.objects.exclude(outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED]):
        if op.outcome == Outcome.PENDING:
            services.operation_dispatch(operation_id=op.id)
        else:
            services.operation_reconcile(operation_id=op.id)
    charged = sum(
        pi["amount"]
        for pid in pids
        for pi in localstripe.payment_intents_for(pid)
        if pi["status"] == "succeeded"
    )
    print(pay_mode, codes, "charged:", charged)
    assert charged <= 4000, (charged, codes)
    succeeded = PaymentOperation.objects.filter(outcome=Outcome.SUCCEEDED)
    assert sum(o.amount for o in succeeded) == charged
    for hold in Hold.objects.all():
        op = hold.operation
        if op.outcome == Outcome.SUCCEEDED:
            assert hold.state == HoldState.CONSUMED
        elif op.outcome == Outcome.FAILED:
            assert hold.state == HoldState.RELEASED
