"""A failing step's compensation meets a refund awaiting approval.

The compensation asks `refund_request(compensation=True)` for the purchase's refundable
room; the room subtracts every refund that is not failed, one still AWAITING APPROVAL
included (nothing has left; finance may decline it). The step is marked compensated with
that smaller refund; finance then declines the one awaiting approval, and nothing ever
returns that part: the buyer received nothing (the step was compensated) and paid for it.
Counted at localstripe; the failing step is a real refused inventory commit.
"""

import pytest

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation, Product, Purchase
from recovery.halts import halt_set
from recovery.models import StepRun, StepState
from recovery.orchestrator import purchase_fulfil
from tests.factories import ProductFactory
from tests.outbox import settle
from tests.recovery.halt_fence import lift_halt_quietly

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_compensated_step_returns_everything_even_if_a_refund_awaiting_approval_is_declined(
    api_client, django_user_model, localstripe
):
    support = django_user_model.objects.create(username="support")
    finance = django_user_model.objects.create(username="finance")
    halt_set(name="step:order", reason="test fence", actor="test")
    product = ProductFactory(price=1500, stock=1)
    quote = services.quote_create(
        api_client=api_client, items=[{"sku": product.sku, "quantity": 1}], currency="usd"
    )
    purchase = services.purchase_create(
        api_client=api_client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference="cust-comp",
        customer_email="buyer@example.com",
    )
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    pay = services.operation_dispatch(operation_id=pay.id)
    assert pay.outcome == Outcome.SUCCEEDED
    settle()

    # support asks for a goodwill refund of 500: it waits for finance
    asked = services.refund_request(purchase_id=purchase.id, amount=500, acting_user=support)
    assert asked.outcome == Outcome.AWAITING_APPROVAL

    # the inventory commit is refused: the step's policy compensates
    Product.objects.filter(sku=product.sku).update(stock=0)
    lift_halt_quietly("step:order")
    purchase_fulfil(purchase_id=purchase.id)
    settle()
    assert StepRun.objects.get(purchase_id=purchase.id, step="inventory").state in (
        StepState.COMPENSATED,
        StepState.MANUAL,
    )

    # finance declines the goodwill refund (the compensation returns the money anyway)
    try:
        services.refund_decline(
            operation_id=asked.id,
            reason="compensated instead",
            actor="finance",
            acting_user=finance,
        )
    except services.DomainError:
        pass
    settle()

    refunded = sum(
        r["amount"]
        for r in localstripe.refunds_for(pay.provider_reference)
        if r["status"] == "succeeded"
    )
    status = Purchase.objects.get(pk=purchase.pk).status
    ops = list(
        PaymentOperation.objects.filter(purchase=purchase).values_list(
            "kind", "amount", "outcome", "is_compensation"
        )
    )
    assert refunded == pay.amount, (
        f"the step was compensated but {pay.amount - refunded} stays with the merchant; "
        f"purchase {status}; {ops}"
    )
