"""Dispatch against localstripe through the real SDK: outcomes, provider counts, holds."""

import pytest

from payments import services
from payments.enums import Grade, HoldState, Outcome, PurchaseStatus, Verification
from payments.models import Hold, ProviderCall
from recovery.models import OutboxCategory, OutboxMessage

pytestmark = pytest.mark.django_db(transaction=True)


def _pay(purchase, api_client, method="pm_card_visa", capture="automatic"):
    op = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method=method,
        capture_method=capture,
    )
    return services.operation_dispatch(operation_id=op.id)


def test_charge_succeeds_once_and_consumes_hold(new_purchase, api_client, localstripe):
    purchase = new_purchase()
    op = _pay(purchase, api_client)
    assert (op.outcome, op.grade, op.verification) == (
        Outcome.SUCCEEDED,
        Grade.CONFIRMED,
        Verification.PROVIDER,
    )
    assert op.provider_reference.startswith("pi_")
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert op.purchase.status == PurchaseStatus.PAID
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED
    calls = list(ProviderCall.objects.filter(operation=op).values_list("step", "classification"))
    assert calls == [("create", "ok"), ("confirm", "ok")]
    assert (
        OutboxMessage.objects.filter(
            category=OutboxCategory.RUN_STEPS, payload={"purchase": purchase.id}
        ).count()
        == 1
    )


def test_decline_fails_with_reason_and_releases_hold(new_purchase, api_client, localstripe):
    purchase = new_purchase()
    op = _pay(purchase, api_client, method="pm_card_chargeCustomerFail")
    assert op.outcome == Outcome.FAILED and op.reason == "card_declined"
    assert localstripe.succeeded_charges_for(purchase.id) == []
    assert Hold.objects.get(operation=op).state == HoldState.RELEASED
    assert op.purchase.status == PurchaseStatus.PAYMENT_FAILED


def test_dispatch_twice_is_one_provider_object(new_purchase, api_client, localstripe):
    purchase = new_purchase()
    op = _pay(purchase, api_client)
    again = services.operation_dispatch(operation_id=op.id)
    assert again.outcome == Outcome.SUCCEEDED
    assert len(localstripe.payment_intents_for(purchase.id)) == 1


def test_authorize_capture_and_void_are_linked_operations(new_purchase, api_client, localstripe):
    purchase = new_purchase()
    auth = _pay(purchase, api_client, capture="manual")
    assert auth.outcome == Outcome.SUCCEEDED and auth.purchase.status == PurchaseStatus.PAID
    assert Hold.objects.get(operation=auth).state == HoldState.RESERVED
    cap = services.capture_create(purchase_id=purchase.id, api_client=api_client)
    cap = services.operation_dispatch(operation_id=cap.id)
    assert cap.outcome == Outcome.SUCCEEDED and cap.parent_id == auth.id
    assert Hold.objects.get(operation=auth).state == HoldState.CONSUMED
    [pi] = localstripe.payment_intents_for(purchase.id)
    assert pi["status"] == "succeeded"

    other = new_purchase()
    auth2 = _pay(other, api_client, capture="manual")
    void = services.operation_dispatch(
        operation_id=services.void_create(purchase_id=other.id, api_client=api_client).id
    )
    assert void.outcome == Outcome.SUCCEEDED
    assert void.purchase.status == PurchaseStatus.VOIDED
    assert Hold.objects.get(operation=auth2).state == HoldState.RELEASED
    [pi2] = localstripe.payment_intents_for(other.id)
    assert pi2["status"] == "canceled"


def test_refund_needs_provider_confirmation_and_respects_refundable(
    new_purchase, api_client, localstripe
):
    purchase = new_purchase(price=2000)
    charge = _pay(purchase, api_client)
    refund = services.refund_request(
        purchase_id=purchase.id, amount=500, api_client=api_client, compensation=True
    )
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.SUCCEEDED and refund.provider_reference.startswith("re_")
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1
    with pytest.raises(services.DomainError) as err:
        services.refund_request(purchase_id=purchase.id, amount=1600, api_client=api_client)
    assert err.value.code == "refund_exceeds_refundable"
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1


def test_api_refund_waits_for_approval_by_someone_else(new_purchase, api_client, django_user_model):
    purchase = new_purchase()
    _pay(purchase, api_client)
    requester = django_user_model.objects.create(username="req")
    approver = django_user_model.objects.create(username="fin")
    refund = services.refund_request(purchase_id=purchase.id, acting_user=requester)
    assert refund.outcome == Outcome.AWAITING_APPROVAL
    with pytest.raises(services.DomainError) as err:
        services.refund_approve(operation_id=refund.id, acting_user=requester, reason="ok")
    assert err.value.code == "approver_is_requester"
    approved = services.refund_approve(
        operation_id=refund.id, acting_user=approver, reason="customer returned goods"
    )
    assert approved.outcome == Outcome.PENDING
    done = services.operation_dispatch(operation_id=refund.id)
    assert done.outcome == Outcome.SUCCEEDED
    assert done.purchase.status == PurchaseStatus.REFUNDED


def test_a_queued_operation_whose_dispatcher_died_is_sent_by_the_outbox(
    new_purchase, api_client, localstripe, settings
):
    """The web process dies between creating the operation and dispatching it: the
    delayed DISPATCH message sends it, once."""
    from django.utils import timezone

    from recovery.relay import relay_drain_once

    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )  # ...and no dispatch call
    message = OutboxMessage.objects.get(
        category=OutboxCategory.DISPATCH, payload={"operation": op.id}
    )
    assert message.available_at > timezone.now()  # not before the request's own lease
    OutboxMessage.objects.filter(id=message.id).update(available_at=timezone.now())
    relay_drain_once()
    from payments.models import PaymentOperation

    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.SUCCEEDED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    relay_drain_once()  # redelivery changes nothing
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
