"""A purchase's status follows its refunds (docs/reliability.md): `refund_pending` only
while a refund is in flight; a partial refund that succeeds lets fulfilment go on and says how
much was refunded; a failed refund restores the prior status with the reason."""

import pytest

from payments import services
from payments.api import presenters
from payments.enums import Outcome, PurchaseStatus
from payments.models import OperationTransition, PaymentOperation, Purchase
from recovery.models import Order
from recovery.relay import relay_drain
from tests.localstripe import provider_object
from tests.webhooks.events import deliver_and_process, event_for

pytestmark = pytest.mark.django_db(transaction=True)


def _status(purchase_id: str) -> str:
    return Purchase.objects.values_list("status", flat=True).get(id=purchase_id)


def _refund_in_provider_pending(
    client, purchase, charge, drill, localstripe, django_user_model, amount
):
    """A refund the provider accepted as `pending`: its answer is lost (unknown), then the
    provider's signed `refund.updated` (built from localstripe's real object) says pending."""
    requester = django_user_model.objects.create(username=f"req-{purchase.id[-6:]}")
    approver = django_user_model.objects.create(username=f"fin-{purchase.id[-6:]}")
    refund = services.refund_request(purchase_id=purchase.id, amount=amount, acting_user=requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    drill(refund, "drop_response_after_send", step="refund")
    assert services.operation_dispatch(operation_id=refund.id).outcome == Outcome.UNKNOWN
    [real] = localstripe.refunds_for(charge.provider_reference)
    obj = {**provider_object("refunds", real["id"]), "status": "pending"}
    assert deliver_and_process(client, event_for(obj, "refund.updated")) == "applied"
    assert PaymentOperation.objects.get(id=refund.id).outcome == Outcome.AWAITING_PROVIDER
    assert _status(purchase.id) == PurchaseStatus.REFUND_PENDING
    return refund, obj


def test_a_partial_refund_that_succeeds_later_lets_fulfilment_go_on(
    client, new_purchase, pay, drill, localstripe, django_user_model
):
    # given a paid purchase whose fulfilment has not run yet
    purchase = new_purchase(price=2000)
    charge = pay(purchase)
    assert _status(purchase.id) == PurchaseStatus.PAID
    refund, _ = _refund_in_provider_pending(
        client, purchase, charge, drill, localstripe, django_user_model, amount=500
    )
    # while it is pending, fulfilment waits
    relay_drain()
    assert _status(purchase.id) == PurchaseStatus.REFUND_PENDING
    assert not Order.objects.filter(purchase_id=purchase.id).exists()
    # when the read-back finds the refund succeeded
    services.operation_reconcile(operation_id=refund.id)
    # then the purchase is back where it was, and fulfilment runs once
    assert PaymentOperation.objects.get(id=refund.id).outcome == Outcome.SUCCEEDED
    relay_drain()
    assert _status(purchase.id) == PurchaseStatus.COMPLETED
    assert Order.objects.filter(purchase_id=purchase.id).count() == 1
    view = presenters.purchase_view(Purchase.objects.get(id=purchase.id))
    assert view["refunds"] == {
        "refunded": 500,
        "in_flight": 0,
        "awaiting_approval": 0,
        "last_failed_reason": None,
    }
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1


def test_a_refund_that_fails_later_restores_the_prior_status_with_the_reason(
    client, new_purchase, pay, drill, localstripe, django_user_model
):
    purchase = new_purchase(price=2000)
    charge = pay(purchase)
    relay_drain()
    assert _status(purchase.id) == PurchaseStatus.COMPLETED
    refund, obj = _refund_in_provider_pending(
        client, purchase, charge, drill, localstripe, django_user_model, amount=2000
    )
    # when the provider reports that the refund failed
    failed = {**obj, "status": "failed", "failure_reason": "expired_or_canceled_card"}
    assert deliver_and_process(client, event_for(failed, "refund.failed")) == "applied"
    # then the purchase is completed again, and the transition says why
    assert PaymentOperation.objects.get(id=refund.id).outcome == Outcome.FAILED
    assert _status(purchase.id) == PurchaseStatus.COMPLETED
    back = OperationTransition.objects.filter(
        purchase_id=purchase.id, field="status", source=PurchaseStatus.REFUND_PENDING
    ).get()
    assert back.target == PurchaseStatus.COMPLETED
    assert back.evidence["refund"] == refund.id and back.evidence["reason"]
    view = presenters.purchase_view(Purchase.objects.get(id=purchase.id))
    assert view["refunds"]["refunded"] == 0 and view["refunds"]["last_failed_reason"]
    # and the whole amount is refundable again
    again = services.refund_request(purchase_id=purchase.id, amount=2000, compensation=True)
    assert again.amount == 2000
