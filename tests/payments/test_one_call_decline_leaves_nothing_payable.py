"""A declined one-call payment leaves no PaymentIntent payable at the provider.

Stripe answers a declined `create(confirm=true)` with a card error; the PaymentIntent it
made stays `requires_payment_method`, and anyone holding the secret key could attach
another card and confirm it later: a charge with no order. Verity settles the payment
failed on the provider's word and cancels that intent, as it does in two steps, where the
create's answer named it. Judged on localstripe's raw list."""

import pytest

from payments import services
from payments.enums import Outcome, Verification
from payments.models import PaymentOperation
from recovery.relay import relay_drain_once

pytestmark = pytest.mark.django_db(transaction=True)

PAYABLE = ("requires_payment_method", "requires_confirmation", "requires_action")


def _drain() -> None:
    while relay_drain_once():
        pass


@pytest.mark.parametrize("mode", ["one_call", "two_step"])
def test_a_declined_payment_leaves_no_payable_intent(
    mode, new_purchase, api_client, localstripe, request
):
    if mode == "one_call":
        request.getfixturevalue("one_call")
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_chargeCustomerFail"
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert (op.outcome, op.verification) == (Outcome.FAILED, Verification.PROVIDER)
    _drain()

    intents = localstripe.payment_intents_for(purchase.id)
    assert len(intents) == 1, intents
    assert [pi["status"] for pi in intents if pi["status"] in PAYABLE] == []
    op = PaymentOperation.objects.get(id=op.id)
    assert op.provider_reference == intents[0]["id"]
