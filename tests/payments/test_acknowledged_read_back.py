"""A person's outcome accepted while the
provider was unreachable is read back later, and the provider's record wins.

The soak saw a resolver's "succeeded" accepted as `acknowledged` during a provider outage on
a payment whose confirm the provider never applied (PaymentIntent `requires_confirmation`):
nothing read it again, the sale stayed booked and the ledger was off by its amount. Now an
acknowledged outcome is read back on the reconcile schedule until the provider confirms or
overturns it; an unapplied payment is cancelled at the provider (no money moved) and the
canceled record overturns the person's word; the ledger reverses what it booked on it.

Counted at localstripe (PaymentIntents, charges) and in the database (operations, outbox,
transitions, ledger rows); faults come from the fault-drill HTTP client only.
"""

import pytest
from django.db.models import Sum

from payments import services
from payments.enums import OVERTURN_CAUSE, Grade, HoldState, Outcome, PurchaseStatus
from payments.models import Hold, OperationTransition, PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from recovery import orchestrator
from recovery.models import EmailMessage, LedgerEntry, Order, OutboxCategory, OutboxMessage
from recovery.reconciler import reconcile_due

pytestmark = pytest.mark.django_db(transaction=True)


def _provider_balance(purchase) -> int:
    return (
        LedgerEntry.objects.filter(purchase_id=purchase.id, account="provider_balance").aggregate(
            s=Sum("amount")
        )["s"]
        or 0
    )


def _dispatched(new_purchase, api_client, drill, mode):
    """A payment whose dispatch met `mode` (a fault drill): `unknown` at Verity."""
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, mode)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    return purchase, op


def _resolve_while_unreachable(op, outcome, read_drill, resolver):
    read_drill(op.provider_reference)  # the read-back before the resolution fails
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome=outcome,
        reason="resolver read the dashboard",
        actor="resolver-22",
        acting_user=resolver,
    )
    assert (op.outcome, op.grade) == (outcome, Grade.ACKNOWLEDGED)
    # a read-back is scheduled: a delayed outbox row and the sweep's due time
    assert op.next_reconcile_at is not None
    assert (
        OutboxMessage.objects.filter(
            category=OutboxCategory.RECONCILE,
            dedupe_key=f"reconcile:{op.id}",
            processed_at__isnull=True,
        ).count()
        == 1
    )
    return op


def test_a_wrong_succeeded_on_an_unapplied_payment_is_cancelled_and_overturned(
    new_purchase, api_client, drill, read_drill, resolver, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    # given a payment whose confirm the provider never applied (409), unknown at Verity
    purchase, op = _dispatched(new_purchase, api_client, drill, DrillMode.HTTP_409)
    # and a person's wrong "succeeded" accepted while the provider could not be read
    op = _resolve_while_unreachable(op, Outcome.SUCCEEDED, read_drill, resolver)
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAID
    # and fulfilment booked the sale on the person's word
    orchestrator.purchase_fulfil(purchase_id=purchase.id)
    assert _provider_balance(purchase) == op.amount

    # when the read-back comes due (the sweep finds it) and runs
    PaymentOperation.objects.filter(pk=op.pk).update(next_reconcile_at="2000-01-01T00:00Z")
    assert reconcile_due() == 1
    op = services.operation_reconcile(operation_id=op.id)

    # then the payment was cancelled at the provider (no money moved, and none can now)
    assert [pi["status"] for pi in localstripe.payment_intents_for(purchase.id)] == ["canceled"]
    assert localstripe.succeeded_charges_for(purchase.id) == []
    # and the provider's record overturned the person's word
    assert (op.outcome, op.grade, op.verification) == (Outcome.FAILED, Grade.CONFIRMED, "provider")
    row = OperationTransition.objects.get(operation=op, cause=OVERTURN_CAUSE)
    assert (row.source, row.target) == ("succeeded", "failed")
    assert Hold.objects.get(operation_id=op.pk).state == HoldState.RELEASED
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.MANUAL_REVIEW
    assert op.next_reconcile_at is None
    # and the ledger follows the provider once the settled message is handled
    orchestrator.operation_settled(operation_id=op.id)
    orchestrator.operation_settled(operation_id=op.id)  # handled twice: reversed once
    assert _provider_balance(purchase) == 0
    assert LedgerEntry.objects.filter(operation_id=op.id, entry_type="sale_reversal").count() == 2
    # and the order made on the person's word is cancelled (once); the sent e-mail cannot
    # be unsent, so the purchase stays in manual review for a person
    order = Order.objects.get(purchase_id=purchase.id)
    assert order.cancelled_at is not None
    assert EmailMessage.objects.filter(purchase_id=purchase.id).count() == 1
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.MANUAL_REVIEW


def test_a_wrong_failed_is_read_back_and_overturned_without_any_event(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):
    # given a charge the provider took whose answer was lost
    purchase, op = _dispatched(new_purchase, api_client, drill, DrillMode.DROP_RESPONSE_AFTER_SEND)
    # and a person's wrong "failed" accepted while the provider could not be read
    op = _resolve_while_unreachable(op, Outcome.FAILED, read_drill, resolver)

    # when the scheduled read-back runs (no webhook ever arrives)
    op = services.operation_reconcile(operation_id=op.id)

    # then the charge the provider made stands, graded confirmed, and fulfilment is queued
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAID
    assert op.next_reconcile_at is None
    assert OperationTransition.objects.filter(operation=op, cause=OVERTURN_CAUSE).count() == 1


def test_an_acknowledged_outcome_is_read_again_while_the_provider_stays_unreachable(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):
    purchase, op = _dispatched(new_purchase, api_client, drill, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = _resolve_while_unreachable(op, Outcome.SUCCEEDED, read_drill, resolver)
    first_due = op.next_reconcile_at

    # when the read-back finds the provider still unreachable
    read_drill(op.provider_reference)
    op = services.operation_reconcile(operation_id=op.id)

    # then the person's outcome stands, and the next read-back is later on the schedule
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    assert op.next_reconcile_at is not None and op.next_reconcile_at > first_due
    # and once it can be read, the provider's agreeing record confirms it (no new charge)
    op = services.operation_reconcile(operation_id=op.id)
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert op.next_reconcile_at is None
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
