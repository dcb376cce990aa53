"""The duplicate-purchase guard and a person's unverified "failed".

"Money is held" (MONEY_HELD_STATUSES) and the guard (DUPLICATE_GUARD_STATUSES) are asked
by purchase STATUS. A purchase whose charge a person called "failed" while the provider
could not be read is `payment_failed`, although its payment is not settled
(`payments.services.common.payment_unsettled`: it may be overturned, and here it is):
neither held nor unresolved, so the same buyer's same basket is bought again. Counted at
localstripe; faults only through the fault-drill HTTP client.
"""

import pytest

from payments import services
from payments.enums import Outcome, PurchaseStatus, Rail
from payments.models import Purchase
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.factories import ProductFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _buy(api_client, product, customer):
    quote = services.quote_create(
        api_client=api_client, items=[{"sku": product.sku, "quantity": 1}], currency="usd"
    )
    return services.purchase_create(
        api_client=api_client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference=customer,
        customer_email="buyer@example.com",
    )


def test_a_basket_whose_charge_a_person_called_failed_unverified_is_not_bought_twice(
    api_client, drill, read_drill, django_user_model, localstripe
):
    resolver = django_user_model.objects.create(username="guard-resolver")
    product = ProductFactory(price=1500)
    first = _buy(api_client, product, "cust-guard")
    pay = services.payment_create(
        purchase_id=first.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(pay, DrillMode.DROP_RESPONSE_AFTER_SEND)
    pay = services.operation_dispatch(operation_id=pay.id)
    assert pay.outcome == Outcome.UNKNOWN  # the provider charged; the answer was lost
    assert len(localstripe.succeeded_charges_for(first.id)) == 1

    read_drill("*", times=10)  # the read-back before the person's word fails
    services.operation_resolve_manual(
        operation_id=pay.id,
        outcome="failed",
        reason="buyer says the card was declined",
        actor="resolver",
        acting_user=resolver,
    )
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    assert Purchase.objects.get(pk=first.pk).status == PurchaseStatus.PAYMENT_FAILED

    # the agent buys the same basket for the same buyer again, with only its own answers
    second = None
    try:
        second = _buy(api_client, product, "cust-guard")
    except services.DomainError as err:
        assert err.code in ("probable_duplicate_purchase", "customer_has_unresolved_purchase")
    if second is not None:
        again = services.payment_create(
            purchase_id=second.id, api_client=api_client, payment_method="pm_card_visa"
        )
        services.operation_dispatch(operation_id=again.id)

    # the first charge is read back later: it did succeed
    services.operation_reconcile(operation_id=pay.id)
    assert Purchase.objects.get(pk=first.pk).status == PurchaseStatus.PAID
    charges = len(localstripe.succeeded_charges_for(first.id)) + (
        len(localstripe.succeeded_charges_for(second.id)) if second is not None else 0
    )
    assert charges == 1, "one buyer, one basket, charged twice"
