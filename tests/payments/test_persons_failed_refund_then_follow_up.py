"""A person's "failed" on a REFUND meets a follow-up refund.

The payment rules of (a person's unverified "failed" is read back before any
follow-up money movement; `retry_of` waits for the provider) were not carried over to
refunds: `operations_verify_before_follow_up` reads back acknowledged payments, captures
and voids, never refunds, and `payment_refund_room` frees the room of every `failed`
refund, a person's unverified word included. Counted at localstripe and in the database;
faults only through the fault-drill HTTP client.
"""

import pytest

from payments import services
from payments.enums import Outcome, Rail
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail

pytestmark = pytest.mark.django_db(transaction=True)


def _paid(new_purchase, api_client):
    purchase = new_purchase(price=1500)
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    pay = services.operation_dispatch(operation_id=pay.id)
    assert pay.outcome == Outcome.SUCCEEDED
    return purchase, pay


def _refund(purchase, requester, approver, amount=None):
    refund = services.refund_request(purchase_id=purchase.id, amount=amount, acting_user=requester)
    return services.refund_approve(
        operation_id=refund.id, acting_user=approver, reason="buyer returned it"
    )


def test_a_refund_a_person_called_failed_unverified_is_read_back_before_another_refund(
    new_purchase, api_client, drill, read_drill, people, localstripe
):
    """A full refund whose answer was lost (the provider made it); a person, the provider
    unreadable for a moment, calls it "failed" (acknowledged). The provider is readable
    again when support asks for the refund once more. Correct: the follow-up reads the
    person's unverified refund back first (as it does for a payment's `retry_of`), sees
    it succeeded and refuses; at most what was captured goes back to the buyer, and the
    ledger's succeeded refunds equal the provider's."""
    resolver, requester, approver = people
    purchase, pay = _paid(new_purchase, api_client)

    first = _refund(purchase, requester, approver)
    drill(first, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    first = services.operation_dispatch(operation_id=first.id)
    assert first.outcome == Outcome.UNKNOWN
    assert [r["amount"] for r in localstripe.refunds_for(pay.provider_reference)] == [1500]

    read_drill("*", times=10)  # the read-back before the resolution fails
    first = services.operation_resolve_manual(
        operation_id=first.id,
        outcome="failed",
        reason="bank says nothing came back",
        actor="resolver",
        acting_user=resolver,
    )
    assert (first.outcome, first.grade) == (Outcome.FAILED, "acknowledged")
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()  # the provider answers reads again

    try:
        again = _refund(purchase, requester, approver)
        services.operation_dispatch(operation_id=again.id)
    except services.DomainError:
        pass  # refused: the correct answer

    refunded = sum(
        r["amount"]
        for r in localstripe.refunds_for(pay.provider_reference)
        if r["status"] == "succeeded"
    )
    assert refunded <= pay.amount, f"{refunded} returned for a {pay.amount} charge"
    booked = sum(
        PaymentOperation.objects.filter(
            parent=pay, kind="refund", outcome=Outcome.SUCCEEDED
        ).values_list("amount", flat=True)
    )
    assert booked == refunded


def test_a_persons_succeeded_on_a_refund_the_provider_never_received_is_not_booked(
    new_purchase, api_client, drill, people, localstripe, settings
):
    """A refund whose send was refused before it reached the provider (409 key in use:
    nothing applied) is `unknown`. The provider is readable: it shows the charge with no
    refund at all. A person says "succeeded". Correct: the
    readable record shows no money moved, so the word is refused, or at the latest the
    read-back overturns it; the ledger never books a refund the provider never made and
    the purchase is not shown refunded."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver, requester, approver = people
    purchase, pay = _paid(new_purchase, api_client)
    refund = _refund(purchase, requester, approver)
    drill(refund, DrillMode.HTTP_409, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN
    assert localstripe.refunds_for(pay.provider_reference) == []

    try:
        services.operation_resolve_manual(
            operation_id=refund.id,
            outcome="succeeded",
            reason="the buyer says the money arrived",
            actor="resolver",
            acting_user=resolver,
        )
    except services.DomainError:
        pass  # refused: the correct answer
    for _ in range(3):  # the read-backs that follow a person's word
        try:
            services.operation_reconcile(operation_id=refund.id)
        except services.DomainError:
            break

    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert localstripe.refunds_for(pay.provider_reference) == []
    assert refund.outcome != Outcome.SUCCEEDED, (
        f"booked {refund.amount} refunded ({refund.grade}) that the provider never made; "
        f"purchase {purchase.__class__.objects.get(pk=purchase.pk).status}"
    )
