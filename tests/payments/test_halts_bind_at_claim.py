"""A halt binds at claim time (docs/reliability.md#rules-every-money-movement-obeys): queued
work of every kind waits, still `pending`, and goes out once the halt clears. Counted at
localstripe and in the outbox."""

import pytest
from django.utils import timezone

from payments import services
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation
from recovery.halts import halt_clear, halt_set
from recovery.models import OutboxCategory, OutboxMessage
from recovery.relay import relay_drain_once

pytestmark = pytest.mark.django_db(transaction=True)


def _outcome(op_id: str) -> str:
    return PaymentOperation.objects.values_list("outcome", flat=True).get(id=op_id)


def _make_dispatches_due() -> None:
    OutboxMessage.objects.filter(
        category=OutboxCategory.DISPATCH, processed_at__isnull=True
    ).update(available_at=timezone.now())


def _waiting_dispatches(op_id: str) -> int:
    return OutboxMessage.objects.filter(
        category=OutboxCategory.DISPATCH, payload={"operation": op_id}, processed_at__isnull=True
    ).count()


def _paid(new_purchase, api_client):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    return purchase, op


def test_a_queued_payment_waits_while_checkout_is_halted_and_goes_out_after(
    new_purchase, api_client, localstripe
):
    # given a payment queued before the halt (its web process died: only the backstop)
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    halt_set(name="checkout", reason="incident", actor="op1")
    # when the backstop runs, and a direct dispatch is tried too
    _make_dispatches_due()
    relay_drain_once()
    assert services.operation_dispatch(operation_id=op.id).outcome == Outcome.PENDING
    # then nothing reached the provider; the operation is queued, not failed
    assert localstripe.payment_intents_for(purchase.id) == []
    assert _outcome(op.id) == Outcome.PENDING
    assert op.provider_calls.count() == 0
    assert _waiting_dispatches(op.id) == 1
    # when the halt clears, the waiting dispatch goes out once
    halt_clear(name="checkout", actor="op1", reason="over")
    relay_drain_once()
    assert _outcome(op.id) == Outcome.SUCCEEDED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert _waiting_dispatches(op.id) == 0


def test_approving_a_refund_while_refunds_are_halted_does_not_dispatch_it(
    new_purchase, api_client, localstripe, django_user_model
):
    purchase, charge = _paid(new_purchase, api_client)
    requester = django_user_model.objects.create(username="req")
    approver = django_user_model.objects.create(username="fin")
    refund = services.refund_request(purchase_id=purchase.id, acting_user=requester)
    assert refund.outcome == Outcome.AWAITING_APPROVAL
    halt_set(name="refunds", reason="incident", actor="op1")
    # when finance approves it (the console dispatches right after) and the backstop runs
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    assert services.operation_dispatch(operation_id=refund.id).outcome == Outcome.PENDING
    _make_dispatches_due()
    relay_drain_once()
    # then no refund exists at the provider and the refund is still queued
    assert localstripe.refunds_for(charge.provider_reference) == []
    assert _outcome(refund.id) == Outcome.PENDING
    assert _waiting_dispatches(refund.id) == 1
    # when the halt clears, it goes out once
    halt_clear(name="refunds", actor="op1", reason="over")
    relay_drain_once()
    assert _outcome(refund.id) == Outcome.SUCCEEDED
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1
    relay_drain_once()
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1


def test_a_queued_compensation_waits_while_refunds_are_halted(
    new_purchase, api_client, localstripe
):
    purchase, charge = _paid(new_purchase, api_client)
    refund = services.refund_request(purchase_id=purchase.id, compensation=True)
    assert refund.outcome == Outcome.PENDING
    halt_set(name="refunds", reason="incident", actor="op1")
    _make_dispatches_due()
    relay_drain_once()
    assert localstripe.refunds_for(charge.provider_reference) == []
    assert _outcome(refund.id) == Outcome.PENDING
    halt_clear(name="refunds", actor="op1", reason="over")
    relay_drain_once()
    assert _outcome(refund.id) == Outcome.SUCCEEDED
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1
    assert PaymentOperation.objects.get(id=refund.id).purchase.status == PurchaseStatus.REFUNDED


def test_a_queued_capture_waits_while_checkout_is_halted(new_purchase, api_client, localstripe):
    purchase = new_purchase()
    auth = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        capture_method="manual",
    )
    assert services.operation_dispatch(operation_id=auth.id).outcome == Outcome.SUCCEEDED
    capture = services.capture_create(purchase_id=purchase.id, api_client=api_client)
    halt_set(name="checkout", reason="incident", actor="op1")
    assert services.operation_dispatch(operation_id=capture.id).outcome == Outcome.PENDING
    assert localstripe.succeeded_charges_for(purchase.id)[0]["status"] == "requires_capture"
    halt_clear(name="checkout", actor="op1", reason="over")
    relay_drain_once()
    assert _outcome(capture.id) == Outcome.SUCCEEDED
    assert localstripe.succeeded_charges_for(purchase.id)[0]["status"] == "succeeded"
