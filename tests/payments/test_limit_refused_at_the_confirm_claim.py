"""A payment refused at its confirm claim by the client's spending limit (two payments
created while the allowance covered each, dispatched one after the other): it is settled
`failed` after its PaymentIntent was created, so the intent must not stay payable with the
secret key beside a failed record (docs/reliability.md
#create-then-claim-then-confirm). Counted at localstripe and in the rows."""

import pytest

from payments import services
from payments.enums import Outcome
from recovery.relay import relay_drain
from tests.factories import ProductFactory, make_client
from tests.payments.test_create_answer_lost import (
    _charges_of,
    _intents_of,
    _no_payable_intent_beside_the_record,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _purchase(client, n: int):
    product = ProductFactory(price=1500, stock=10, name=f"Lamp L{n}")
    quote = services.quote_create(
        api_client=client, items=[{"sku": product.sku, "quantity": 1}], currency="usd"
    )
    return services.purchase_create(
        api_client=client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference=f"limit-buyer-{n}",
        customer_email=f"limit-{n}@example.com",
    )


def test_a_payment_refused_by_the_limit_at_its_confirm_leaves_no_payable_intent(localstripe):
    client, _ = make_client(limit=2000)
    first, second = _purchase(client, 1), _purchase(client, 2)
    ops = [
        services.payment_create(purchase_id=p.id, api_client=client, payment_method="pm_card_visa")
        for p in (first, second)
    ]
    done = [services.operation_dispatch(operation_id=op.id) for op in ops]
    relay_drain()

    assert done[0].outcome == Outcome.SUCCEEDED
    assert (done[1].outcome, done[1].reason) == (Outcome.FAILED, "spending_limit_exceeded")
    [refused] = _intents_of(localstripe, done[1])
    assert refused["status"] == "canceled"
    assert _charges_of(localstripe, second.id) == []
    assert len(_charges_of(localstripe, first.id)) == 1
    _no_payable_intent_beside_the_record()
