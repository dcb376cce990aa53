"""One refundable room per payment (captured minus that payment's own
refunds that are not failed), asked alike by refund request, approval, the console and
external refunds. After a compensated duplicate, the purchase's own charge can still be
refunded in full, and not a cent more.

Real stack: localstripe refunds counted per PaymentIntent, operations counted in the DB.
"""

import pytest

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation, Purchase
from support.selectors import refundable_amount
from tests.factories import ProductFactory, make_client
from tests.payments.test_provider_outranks_people import _charged_twice

pytestmark = pytest.mark.django_db(transaction=True)


def _compensated_duplicate(new_purchase, api_client, drill, read_drill, resolver, localstripe):
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    comp = PaymentOperation.objects.get(parent=first, kind="refund")
    assert services.operation_dispatch(operation_id=comp.id).outcome == Outcome.SUCCEEDED
    return purchase, first, retry


def test_after_a_compensated_duplicate_the_own_charge_is_refundable_and_approvable(
    new_purchase, api_client, drill, read_drill, people, localstripe
):
    resolver, requester, approver = people
    purchase, first, retry = _compensated_duplicate(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    # the console offers what the core allows: the own charge, whole
    assert refundable_amount(purchase) == retry.amount

    refund = services.refund_request(
        purchase_id=purchase.id, amount=retry.amount, acting_user=requester
    )
    assert (refund.parent_id, refund.outcome) == (retry.id, Outcome.AWAITING_APPROVAL)
    # approval asks the same room (without the refund itself): not "refundable now: 0"
    refund = services.refund_approve(
        operation_id=refund.id, acting_user=approver, reason="buyer returned the goods"
    )
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.SUCCEEDED
    assert [r["amount"] for r in localstripe.refunds_for(retry.provider_reference)] == [
        retry.amount
    ]
    assert [r["amount"] for r in localstripe.refunds_for(first.provider_reference)] == [
        first.amount
    ]
    # and nothing is left anywhere
    assert refundable_amount(purchase) == 0
    with pytest.raises(services.DomainError) as err:
        services.refund_request(purchase_id=purchase.id, amount=1, acting_user=requester)
    assert err.value.code == "refund_exceeds_refundable"
    assert PaymentOperation.objects.filter(purchase=purchase, kind="refund").count() == 2


def test_approval_still_refuses_beyond_the_own_charges_room(
    new_purchase, api_client, drill, read_drill, people, localstripe
):
    resolver, requester, approver = people
    purchase, first, retry = _compensated_duplicate(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    a = services.refund_request(
        purchase_id=purchase.id, amount=retry.amount - 100, acting_user=requester
    )
    # a second request fits only the room left beside the first (in flight counts)
    with pytest.raises(services.DomainError) as err:
        services.refund_request(purchase_id=purchase.id, amount=101, acting_user=requester)
    assert err.value.code == "refund_exceeds_refundable"
    assert err.value.extra["refundable"] == 100
    b = services.refund_request(purchase_id=purchase.id, amount=100, acting_user=requester)
    assert refundable_amount(purchase) == 0
    services.refund_approve(operation_id=a.id, acting_user=approver, reason="ok")
    assert services.operation_dispatch(operation_id=a.id).outcome == Outcome.SUCCEEDED
    services.refund_approve(operation_id=b.id, acting_user=approver, reason="ok")
    assert services.operation_dispatch(operation_id=b.id).outcome == Outcome.SUCCEEDED
    assert sorted(r["amount"] for r in localstripe.refunds_for(retry.provider_reference)) == [
        100,
        retry.amount - 100,
    ]


def test_a_refund_a_person_called_failed_unread_holds_its_room(
    localstripe, drill, read_drill, django_user_model
):
    """A refund whose answer was lost, settled `failed` by a person while the provider could
    not be read, still holds its amount: the room counts a refund only a person called
    failed until the provider is read back. The provider's record agrees (that refund did
    pay 500 back), so offering 1500 would pay that 500 back twice (the lifecycle
    machine's rule `refundable_room_is_one_payments_everywhere` counts it the same way)."""
    from django.contrib.auth.models import Group

    from payments import services
    from payments.enums import Outcome
    from payments.models import PaymentOperation
    from payments.providers.stripe import DrillMode
    from support.access import Role
    from support.selectors import refundable_amount

    product = ProductFactory(sku="FBM-ROOM", price=1500, stock=10)
    client, _ = make_client(name="shop-room", limit=100_000_000)
    quote = services.quote_create(
        api_client=client, currency="usd", items=[{"sku": product.sku, "quantity": 1}]
    )
    purchase = services.purchase_create(
        api_client=client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference="cust-room",
    )
    payment = services.operation_dispatch(
        operation_id=services.payment_create(
            purchase_id=purchase.id, api_client=client, payment_method="pm_card_visa"
        ).id
    )
    assert payment.outcome == Outcome.SUCCEEDED

    people = {}
    for name, role in (("asker", Role.SUPPORT), ("approver", Role.FINANCE)):
        people[name] = django_user_model.objects.create(username=name)
        people[name].groups.add(Group.objects.get_or_create(name=role.value)[0])
    refund = services.refund_request(
        purchase_id=purchase.id, amount=500, acting_user=people["asker"]
    )
    services.refund_approve(operation_id=refund.id, acting_user=people["approver"], reason="ok")
    drill(refund, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    assert services.operation_dispatch(operation_id=refund.id).outcome == Outcome.UNKNOWN
    read_drill("*", times=5)  # the provider cannot be read back
    refund = services.operation_resolve_manual(
        operation_id=refund.id,
        outcome="failed",
        reason="looks failed to me",
        actor="approver",
        acting_user=people["approver"],
    )
    assert (refund.outcome, refund.grade) == ("failed", "acknowledged")

    # The provider's record: the refund did pay 500 back.
    [back] = localstripe.refunds_for(payment.provider_reference)
    assert (back["amount"], back["status"]) == (500, "succeeded")
    # The console offers what is left by that record; "not failed only" would say 1500.
    assert refundable_amount(Purchase.objects.get(id=purchase.id)) == 1000
    not_failed = sum(
        PaymentOperation.objects.filter(parent=payment, kind="refund")
        .exclude(outcome="failed")
        .values_list("amount", flat=True)
    )
    assert 1500 - not_failed == 1500  # the invariant's old rule: wrong by the provider
