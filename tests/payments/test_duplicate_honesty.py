"""What the customer and the API read about a purchase follows the
purchase's own payment. The return of a duplicate charge is not a refund of the purchase;
a dispute of the duplicate neither moves the purchase to disputed nor pauses or cancels
its order, nor tells the customer their bank returned the money. What is left of the
duplicate is returned once the bank gave it back (won), and never while the bank holds it.

Real stack: the duplicate from a lost answer, a person's wrong "failed" and a retry;
the dispute from localstripe's dispute resource, delivered as signed events; localstripe
refunds counted per PaymentIntent.
"""

import pytest

from payments import services
from payments.api.presenters import purchase_view
from payments.customer_copy import StateCode, customer_state
from payments.enums import Outcome, PurchaseStatus, Reason
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from recovery.models import Order
from tests.localstripe import provider_object
from tests.outbox import settle
from tests.payments.test_provider_outranks_people import _charged_twice
from tests.webhooks.test_disputes import ledger_balance, move_dispute, open_dispute, provider_net

pytestmark = pytest.mark.django_db(transaction=True)


def _view(purchase):
    return purchase_view(Purchase.objects.get(pk=purchase.pk))


def test_the_return_of_a_duplicate_is_not_a_refund_of_the_purchase(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    comp = PaymentOperation.objects.get(parent=first, kind="refund")
    assert services.operation_dispatch(operation_id=comp.id).outcome == Outcome.SUCCEEDED
    assert [r["amount"] for r in localstripe.refunds_for(first.provider_reference)] == [
        first.amount
    ]

    view = _view(purchase)
    assert view["refunds"] == {
        "refunded": 0,
        "in_flight": 0,
        "awaiting_approval": 0,
        "last_failed_reason": None,
    }
    assert view["status"] == PurchaseStatus.PAID
    state = customer_state(Purchase.objects.get(pk=purchase.pk))
    assert state.code != StateCode.REVERSED and "returned" not in state.message


def _disputed_duplicate(
    new_purchase, api_client, drill, read_drill, resolver, deliver, localstripe
):
    """A duplicate whose compensation the provider refused (the bank holds the money:
    Stripe refuses a refund of a disputed charge)."""
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    first = PaymentOperation.objects.get(pk=first.pk)
    [comp] = PaymentOperation.objects.filter(parent=first, kind="refund")
    dispute = open_dispute(first.provider_charge, reason="duplicate")
    assert (
        deliver(provider_object("disputes", dispute["id"]), "charge.dispute.created") == "applied"
    )
    drill(comp, DrillMode.HTTP_400_REFUSED, step="refund")
    comp = services.operation_dispatch(operation_id=comp.id)
    assert (comp.outcome, comp.reason) == (Outcome.FAILED, Reason.PROVIDER_REFUSED)
    settle()
    return purchase, first, retry, dispute


def test_a_dispute_of_the_duplicate_leaves_the_purchase_and_its_order_alone(
    new_purchase, api_client, drill, read_drill, resolver, deliver, localstripe
):
    purchase, first, retry, dispute = _disputed_duplicate(
        new_purchase, api_client, drill, read_drill, resolver, deliver, localstripe
    )
    # the purchase is fulfilled on its own charge; no second compensation while the bank
    # holds the duplicate's money
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.COMPLETED
    assert Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).count() == 1
    assert PaymentOperation.objects.filter(parent=first, kind="refund").count() == 1

    # the bank decides for the buyer: the duplicate's money went back through the bank
    move_dispute(dispute["id"], "lost")
    assert deliver(provider_object("disputes", dispute["id"]), "charge.dispute.closed") == "applied"
    settle()

    purchase = Purchase.objects.get(pk=purchase.pk)
    assert purchase.status == PurchaseStatus.COMPLETED
    assert Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).count() == 1
    state = customer_state(purchase)
    assert state.code != StateCode.DISPUTE_LOST and "bank has returned" not in state.message
    # nothing more goes back: the bank returned it already
    assert PaymentOperation.objects.filter(parent=first, kind="refund").count() == 1
    assert localstripe.refunds_for(first.provider_reference) == []
    assert localstripe.refunds_for(retry.provider_reference) == []


def test_a_won_dispute_of_the_duplicate_returns_what_is_left(
    new_purchase, api_client, drill, read_drill, resolver, deliver, localstripe
):
    purchase, first, retry, dispute = _disputed_duplicate(
        new_purchase, api_client, drill, read_drill, resolver, deliver, localstripe
    )

    move_dispute(dispute["id"], "won")
    assert deliver(provider_object("disputes", dispute["id"]), "charge.dispute.closed") == "applied"
    settle()

    # the merchant has the duplicate's money again: its compensation returns it, once
    returned = PaymentOperation.objects.filter(
        parent=first, kind="refund", outcome=Outcome.SUCCEEDED
    )
    assert [op.amount for op in returned] == [first.amount]
    assert [r["amount"] for r in localstripe.refunds_for(first.provider_reference)] == [
        first.amount
    ]
    assert localstripe.refunds_for(retry.provider_reference) == []
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.COMPLETED
    # and the books hold what the provider holds (the duplicate's sale the dispute booked
    # is reversed by its return)
    first, retry = (PaymentOperation.objects.get(pk=o.pk) for o in (first, retry))
    sources = {
        first.provider_charge,
        retry.provider_charge,
        dispute["id"],
        *(r["id"] for r in localstripe.refunds_for(first.provider_reference)),
    }
    assert ledger_balance(purchase.pk) == provider_net(localstripe, sources)
