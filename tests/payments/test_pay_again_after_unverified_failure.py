""" "pay again" after a person's
unverified "failed".

A charge succeeds at localstripe but its answer is lost (fault-drill HTTP client); the
provider cannot be read; a person resolves the payment `failed` (grade acknowledged: the
provider has not confirmed it, and may overturn it). The customer page is the buyer's
view: its rule (payments/customer_copy.py) is that "Pay again" is offered only when the
last payment definitively failed. The buyer then follows the invitation while reads still
fail. Counted at localstripe.

Seen before the fix: can_pay_again=True, next step buyer/new_operation (by_team=True);
the retry the page invited was refused (original_unverified) and localstripe held 1
succeeded charge: the page and the REST advice invited an action the server refuses while
money had in fact moved. Fixed in payments.next_action (FAILED_UNCONFIRMED: reconciliation
owns it, no retry), rendered by every surface.
"""

import pytest

from payments import services
from payments.customer_copy import customer_state
from payments.enums import Outcome, Rail, RetryAdvice
from payments.models import Purchase
from payments.next_action import purchase_next_step
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_persons_unverified_failure_does_not_invite_the_buyer_to_pay_again(
    api_client, new_purchase, drill, read_drill, django_user_model, localstripe, settings
):
    settings.STOREFRONT_CHECKOUT_URL = "https://shop.example/checkout/{purchase_id}"
    resolver = django_user_model.objects.create(username="r4-resolver")
    purchase = new_purchase(customer="cust-r4-pay-again")
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(pay, DrillMode.DROP_RESPONSE_AFTER_SEND)
    pay = services.operation_dispatch(operation_id=pay.id)
    assert pay.outcome == Outcome.UNKNOWN
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1  # money moved

    read_drill("*", times=10)
    services.operation_resolve_manual(
        operation_id=pay.id,
        outcome="failed",
        reason="buyer says it was declined",
        actor="r4-resolver",
        acting_user=resolver,
    )
    p = Purchase.objects.get(pk=purchase.pk)
    state = customer_state(p)
    step = purchase_next_step(p)
    print(
        f"customer page can_pay_again={state.can_pay_again} "
        f"next step retry={step.retry} owner={step.owner} by_team={step.by_team}"
    )
    # The buyer follows the invitation; the provider still cannot be read.
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    read_drill("*", times=10)
    try:
        again = services.payment_create(
            purchase_id=purchase.id,
            api_client=api_client,
            payment_method="pm_card_mastercard",
            retry_of=pay.id,
        )
        services.operation_dispatch(operation_id=again.id)
    except services.DomainError as err:
        print(f"retry refused: {err.code}")
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    charges = len(localstripe.succeeded_charges_for(purchase.id))
    print(f"succeeded charges at localstripe for one purchase: {charges}")
    assert charges == 1, f"one purchase, {charges} charges"
    assert not state.can_pay_again, "the page invites a second payment while money moved"
    assert step.retry != RetryAdvice.NEW_OPERATION
