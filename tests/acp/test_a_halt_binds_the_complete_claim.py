"""A halt binds at claim time (a rule every money movement obeys,
docs/reliability.md#rules-every-money-movement-obeys) on the ACP face, in both payment
modes: after a declined complete, checkout is halted while the next complete waits for its
purchase's lock (its request checks passed). Nothing may leave for the provider while the
halt stands. Counted at localstripe over plain HTTP."""

from __future__ import annotations

import threading

import pytest

from payments.models import PaymentOperation, Purchase
from recovery.halts import halt_clear, halt_set
from tests.acp.agent import new_email
from tests.acp.tokens import issue_spt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
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
def test_a_halt_set_before_the_complete_claims_holds_the_payment(
    pay_mode, agent, tea, localstripe, held_purchase
):
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    r = agent.complete(sid, issue_spt(1250, payment_method="pm_card_chargeCustomerFail"), email)
    assert r.status_code == 402, r.text
    purchase = Purchase.objects.get(acp_session__id=sid)
    before = {pi["id"] for pi in localstripe.payment_intents_for(purchase.id)}
    answer: dict = {}

    def complete():
        answer["r"] = agent.complete(sid, issue_spt(1250), email)

    held_purchase.hold(purchase.id)
    payer = threading.Thread(target=complete)
    payer.start()
    held_purchase.wait_for_a_waiter("the complete")
    halt_set(name="checkout", reason="incident", actor="ops")
    try:
        held_purchase.release()
        payer.join(30)
        new = [pi for pi in localstripe.payment_intents_for(purchase.id) if pi["id"] not in before]
        ops = list(
            PaymentOperation.objects.filter(purchase=purchase).values_list("outcome", flat=True)
        )
        print(pay_mode, answer["r"].status_code, ops, [pi["status"] for pi in new])
        assert new == [], [pi["status"] for pi in new]
    finally:
        halt_clear(name="checkout", actor="ops", reason="over")
