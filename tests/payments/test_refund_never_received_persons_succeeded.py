"""A person's "succeeded" on a refund the
provider never received is accepted only while the provider cannot be read; the next
read-back (a readable provider, no refund of this operation, past the in-flight window)
overturns it, and a person's "failed" on such a refund is confirmed so its amount is
free again. Counted at localstripe; faults only through the fault-drill HTTP client."""

import pytest

from payments import services
from payments.enums import Grade, Outcome, PurchaseStatus, Rail
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.payments.test_persons_failed_refund_then_follow_up import _paid, _refund

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("word", ["succeeded", "failed"])
def test_a_persons_word_on_a_refund_the_provider_never_received_is_read_back(
    word, new_purchase, api_client, drill, read_drill, people, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver, requester, approver = people
    purchase, pay = _paid(new_purchase, api_client)
    refund = _refund(purchase, requester, approver)
    drill(refund, DrillMode.HTTP_409, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN

    read_drill("*", times=10)  # the provider cannot be read: the person's word is taken
    refund = services.operation_resolve_manual(
        operation_id=refund.id,
        outcome=word,
        reason="the buyer's bank says so",
        actor="resolver",
        acting_user=resolver,
    )
    assert (refund.outcome, refund.grade) == (word, Grade.ACKNOWLEDGED)
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()

    services.operation_reconcile(operation_id=refund.id)
    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert localstripe.refunds_for(pay.provider_reference) == []
    assert (refund.outcome, refund.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    assert Purchase.objects.get(pk=purchase.pk).status != PurchaseStatus.REFUNDED
    # no money moved: the whole charge can be refunded again
    again = _refund(purchase, requester, approver)
    assert again.amount == pay.amount
