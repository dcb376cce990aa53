"""A halt binds at claim time (a rule every money movement obeys,
docs/reliability.md#rules-every-money-movement-obeys), in both payment modes: checkout is
halted while a REST payment request waits for its purchase's lock, after its request checks
and before its claim. The halt committed before the claim, so nothing may leave for the
provider while it stands: the payment waits (queued), it does not go out. Counted at
localstripe over plain HTTP."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from payments.enums import Outcome
from payments.models import PaymentOperation
from recovery.halts import halt_clear, halt_set
from tests.api.client import Api, new_key
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


@pytest.mark.parametrize(
    "pay_mode",
    [
        "two_step",
        "one_call",
    ],
    indirect=True,
)
def test_a_halt_set_before_the_claim_holds_the_payment(pay_mode, localstripe, held_purchase):
    client, key = make_client(limit=10_000_000)
    shop = Api(key, client)
    pid = shop.new_purchase(ProductFactory(price=1500).sku)["id"]
    answer: dict = {}

    def pay():
        try:
            answer["r"] = shop.pay(pid, key=new_key())
        finally:
            connection.close()

    held_purchase.hold(pid)
    payer = threading.Thread(target=pay)
    payer.start()
    held_purchase.wait_for_a_waiter("the payment request")
    # The request passed its checks and waits for the purchase: now checkout is halted.
    halt_set(name="checkout", reason="incident", actor="ops")
    try:
        held_purchase.release()
        payer.join(30)
        r = answer["r"]
        intents = localstripe.payment_intents_for(pid)
        ops = list(
            PaymentOperation.objects.filter(purchase_id=pid).values_list("outcome", flat=True)
        )
        print(pay_mode, r.status_code, ops, [i["status"] for i in intents])
        # Nothing left for the provider while checkout is halted.
        assert intents == [], [i["status"] for i in intents]
        assert all(o in (Outcome.PENDING,) for o in ops), ops
    finally:
        halt_clear(name="checkout", actor="ops", reason="over")
