"""A refund the provider refuses with a definitive 4xx (already refunded,
disputed) is `failed` with its reason, not `unknown` for ever holding the purchase's slot;
the compensation of a duplicate asks for what is LEFT of it.

localstripe accepts any refund (Stripe refuses an over-refund with 400
`charge_already_refunded`): the refusal comes from the fault-drill HTTP client
(DrillMode.HTTP_400_REFUSED), which answers as Stripe does and sends nothing on.
Counted at localstripe (refunds per PaymentIntent) and in the database.
"""

import pytest
import requests
from django.conf import settings

from payments import services
from payments.enums import Outcome, PurchaseStatus, Reason
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from tests.localstripe import provider_object
from tests.outbox import settle
from tests.payments.test_provider_outranks_people import _charged_twice

pytestmark = pytest.mark.django_db(transaction=True)


def _approved_refund(purchase, amount, requester, approver):
    refund = services.refund_request(purchase_id=purchase.id, amount=amount, acting_user=requester)
    return services.refund_approve(
        operation_id=refund.id, acting_user=approver, reason="buyer returned it"
    )


def test_a_refund_the_provider_refuses_is_failed_with_its_reason_and_frees_the_slot(
    new_purchase, api_client, drill, people, localstripe
):
    _resolver, requester, approver = people
    purchase = new_purchase()
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    pay = services.operation_dispatch(operation_id=pay.id)
    assert pay.outcome == Outcome.SUCCEEDED

    refund = _approved_refund(purchase, 500, requester, approver)
    drill(refund, DrillMode.HTTP_400_REFUSED, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)

    # the provider's refusal is a failure with its reason; nothing moved
    assert (refund.outcome, refund.reason) == (Outcome.FAILED, Reason.PROVIDER_REFUSED)
    assert localstripe.refunds_for(pay.provider_reference) == []
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAID
    # the slot is free: the next refund is made, once
    again = _approved_refund(purchase, 500, requester, approver)
    assert services.operation_dispatch(operation_id=again.id).outcome == Outcome.SUCCEEDED
    assert [r["amount"] for r in localstripe.refunds_for(pay.provider_reference)] == [500]


def test_a_duplicate_partly_refunded_in_the_dashboard_is_compensated_for_what_is_left(
    new_purchase, api_client, drill, read_drill, people, deliver, localstripe
):
    resolver, _requester, _approver = people
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)  # first is the duplicate
    [comp] = PaymentOperation.objects.filter(parent=first, kind="refund")
    assert comp.amount == first.amount and comp.outcome == Outcome.PENDING

    # before the compensation leaves, a person refunds 500 of the duplicate in the dashboard
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/refunds",
        timeout=10,
        auth=(settings.STRIPE_API_KEY, ""),
        data={"payment_intent": first.provider_reference, "amount": 500},
    )
    r.raise_for_status()
    assert deliver(provider_object("refunds", r.json()["id"]), "refund.created") == "applied"

    # the provider refuses the full amount (Stripe: over-refund, charge_already_refunded)
    drill(comp, DrillMode.HTTP_400_REFUSED, step="refund")
    comp = services.operation_dispatch(operation_id=comp.id)
    assert (comp.outcome, comp.reason) == (Outcome.FAILED, Reason.PROVIDER_REFUSED)
    settle()

    # a new compensation asked for what was left, and returned it
    rest = (
        PaymentOperation.objects.filter(
            parent=first,
            kind="refund",
            is_compensation=True,
        )
        .exclude(pk=comp.pk)
        .get()
    )
    assert (rest.amount, rest.outcome, rest.rail) == (
        first.amount - 500,
        Outcome.SUCCEEDED,
        "stripe",
    )
    assert sorted(x["amount"] for x in localstripe.refunds_for(first.provider_reference)) == [
        500,
        first.amount - 500,
    ]
    assert localstripe.refunds_for(retry.provider_reference) == []
    # nothing holds the purchase's slot; it is fulfilled on its own charge
    assert not PaymentOperation.objects.filter(
        purchase=purchase, outcome__in=("pending", "dispatching", "unknown")
    ).exists()
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.COMPLETED
