"""An x402 payment's follow-ups never reach Stripe.

Every Stripe write step and every Stripe read is armed with a fault drill (the fault-drill
HTTP client) as a tripwire: a request that reached the Stripe adapter would take one and
fail. The x402 purchase is then refunded, reconciled (charge and refund), read back, and
asked to capture and void. Afterwards no tripwire was taken, localstripe holds no object
for the purchase, and the chain shows exactly one transfer back to the payer.
"""

import pytest

from payments import services
from payments.enums import Rail
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.x402.test_refunds import _paid

pytestmark = pytest.mark.django_db(transaction=True)

_STEPS = ("create", "confirm", "capture", "cancel", "refund")


def test_x402_follow_ups_never_reach_stripe(
    agent,
    report,
    chain,
    people,  # noqa: F811
    localstripe,
):
    purchase, payer, charge = _paid(agent, report, chain)
    stripe = provider_for_rail(Rail.STRIPE)
    for step in _STEPS:
        stripe.arm_drill(key_prefix="*", step=step, mode=DrillMode.HTTP_500, times=5)
    stripe.arm_drill(key_prefix="*", step="read", mode=DrillMode.READ_UNAVAILABLE, times=5)
    armed = stripe.drill_client._armed
    try:
        _, requester, approver = people
        refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
        assert refund.rail == Rail.X402
        services.refund_approve(operation_id=refund.id, acting_user=approver, reason="back")
        done = services.operation_dispatch(operation_id=refund.id)
        for op_id in (charge.id, refund.id):
            try:
                services.operation_reconcile(operation_id=op_id)
            except services.DomainError as exc:  # a confirmed record is not read again
                assert exc.code == "already_settled"
            services.operation_read_canonical(operation_id=op_id)
        refusals = []
        for create in (services.capture_create, services.void_create):
            with pytest.raises(services.DomainError) as err:
                create(purchase_id=purchase["id"])
            refusals.append(err.value.code)
        untouched = {key: d.times for key, d in armed.items()}
    finally:
        stripe.drill_client.disarm_all()

    assert done.outcome == "succeeded", done.reason
    assert refusals == ["x402_has_no_capture", "x402_has_no_void"]
    assert untouched == {**{("*", s): 5 for s in _STEPS}, ("*", "read"): 5}, untouched
    assert localstripe.payment_intents_for(purchase["id"]) == []
    assert chain.transfers_back(payer.address) == 1
