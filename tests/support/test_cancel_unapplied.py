"""An `http_409` confirm the provider never applied: the read-back
shows the PaymentIntent still `requires_confirmation`; past the provider's in-flight window
the operation is escalated at once, and an operator can cancel it at the provider and mark
it failed (audited, reason required, refused if the cancel fails). The customer page and
the unresolved-customer guard follow."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied

from payments import services as pay
from payments.enums import Grade, Outcome, PurchaseStatus, Stage
from payments.models import PaymentOperation, Purchase
from support.customer_copy import customer_state
from support.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unapplied(new_purchase, api_client, drill, settings):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase(customer="cust-409")
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "http_409")
    op = pay.operation_dispatch(operation_id=op.pk)
    assert op.outcome == Outcome.UNKNOWN
    return purchase, op


def test_an_unapplied_confirm_is_escalated_at_the_first_read_back(unapplied, localstripe):
    purchase, op = unapplied
    assert [pi["status"] for pi in localstripe.payment_intents_for(purchase.pk)] == [
        "requires_confirmation"
    ]
    op = pay.operation_reconcile(operation_id=op.pk)
    assert op.outcome == Outcome.UNKNOWN  # absence of an applied write is not failure...
    assert op.stage == Stage.ESCALATED and op.escalated_at is not None  # ...but a person owns it
    assert op.transitions.filter(cause="escalated_unapplied_write").count() == 1


def test_cancel_at_the_provider_and_mark_failed_settles_it(
    unapplied, localstripe, login, new_purchase, api_client
):
    purchase, op = unapplied
    pay.operation_reconcile(operation_id=op.pk)
    console = login("operator")
    page = console.get(f"/console/purchases/{purchase.pk}/")
    assert b"Cancel at the provider and mark failed" in page.content
    # No reason: refused, nothing changes.
    console.post(f"/console/operations/{op.pk}/cancel-unapplied", {"confirm": "yes"})
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.UNKNOWN
    console.post(
        f"/console/operations/{op.pk}/cancel-unapplied",
        {"confirm": "yes", "reason": "409 confirm never applied; buyer asked"},
    )
    op = PaymentOperation.objects.get(pk=op.pk)
    assert (op.outcome, op.grade, op.reason) == (
        Outcome.FAILED,
        Grade.CONFIRMED,
        "provider_canceled",
    )
    assert [pi["status"] for pi in localstripe.payment_intents_for(purchase.pk)] == ["canceled"]
    assert localstripe.succeeded_charges_for(purchase.pk) == []
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAYMENT_FAILED
    assert (
        AuditEntry.objects.filter(action="console.cancel_unapplied", target_id=op.pk).count() == 1
    )
    # The customer page and the unresolved guard follow: the buyer may buy again.
    assert customer_state(Purchase.objects.get(pk=purchase.pk)).code == "failed"
    again = new_purchase(customer="cust-409")
    assert again.pk != purchase.pk


def test_the_cancel_is_refused_if_the_provider_does_not_confirm_it(
    unapplied, localstripe, users, drill
):
    from support.services import ConsoleError, operation_cancel_unapplied_by_user

    purchase, op = unapplied
    pay.operation_reconcile(operation_id=op.pk)
    drill(op, "http_500", step="cancel")
    with pytest.raises(ConsoleError) as refused:
        operation_cancel_unapplied_by_user(operation_id=op.pk, user=users["operator"], reason="try")
    assert refused.value.code == "cancel_failed"
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.UNKNOWN
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAYMENT_UNKNOWN
    assert AuditEntry.objects.filter(action="console.cancel_unapplied.refused").count() == 1
    # Support without the operator role cannot do it at all.
    with pytest.raises(PermissionDenied):
        operation_cancel_unapplied_by_user(operation_id=op.pk, user=users["support"], reason="try")


def test_a_payment_the_provider_did_apply_is_not_cancelled(
    new_purchase, api_client, drill, localstripe, users, settings
):
    from support.services import ConsoleError, operation_cancel_unapplied_by_user

    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase(customer="cust-applied")
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "drop_response_after_send")
    op = pay.operation_dispatch(operation_id=op.pk)
    assert op.outcome == Outcome.UNKNOWN
    with pytest.raises(ConsoleError) as refused:
        operation_cancel_unapplied_by_user(
            operation_id=op.pk, user=users["operator"], reason="looks stuck"
        )
    assert refused.value.code == "provider_applied"
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.SUCCEEDED
    assert len(localstripe.succeeded_charges_for(purchase.pk)) == 1
