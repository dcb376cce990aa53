"""The ledger follows the provider's record when it overturns a person's word on a refund or
a void (docs/reliability.md#the-providers-record-outranks-a-person; the refundable room of a
payment is what it captured minus its own refunds, everywhere it is asked).

A refund a person called "succeeded" is booked (money back to the buyer). When the
provider's record overturns it to failed, the refundable room is freed; the ledger must
free it too, or a new refund is booked on top of one that never happened. Counted at
localstripe (refunds, PaymentIntents) and in the database (operations, ledger rows);
faults only through the fault-drill HTTP client.
"""

import pytest
from django.db.models import Sum

from payments import services
from payments.enums import OVERTURN_CAUSE, Grade, Outcome, Rail
from payments.models import OperationTransition, PaymentOperation
from payments.providers.stripe import DrillMode
from recovery import orchestrator
from recovery.models import LedgerEntry
from recovery.relay import relay_drain

pytestmark = pytest.mark.django_db(transaction=True)


def _provider_balance(purchase_id: str) -> int:
    return (
        LedgerEntry.objects.filter(purchase_id=purchase_id, account="provider_balance").aggregate(
            s=Sum("amount")
        )["s"]
        or 0
    )


def _refunded_at_localstripe(localstripe, pay) -> int:
    return sum(
        r["amount"]
        for r in localstripe.refunds_for(pay.provider_reference)
        if r["status"] == "succeeded"
    )


def _approved_refund(purchase, requester, approver, amount):
    refund = services.refund_request(purchase_id=purchase.id, amount=amount, acting_user=requester)
    return services.refund_approve(
        operation_id=refund.id, acting_user=approver, reason="buyer returned it"
    )


def test_a_refund_overturned_to_failed_is_unbooked_and_a_new_refund_books_once(
    new_purchase, api_client, drill, read_drill, people, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver, requester, approver = people
    # given a paid, fulfilled purchase (the sale is booked)
    purchase = new_purchase(price=1500)
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    pay = services.operation_dispatch(operation_id=pay.id)
    assert pay.outcome == Outcome.SUCCEEDED
    relay_drain()
    assert _provider_balance(purchase.id) == 1500

    # and a partial refund whose send the provider refused unapplied (409): unknown, and
    # localstripe holds no refund of it
    first = _approved_refund(purchase, requester, approver, 600)
    drill(first, DrillMode.HTTP_409, step="refund")
    first = services.operation_dispatch(operation_id=first.id)
    assert first.outcome == Outcome.UNKNOWN
    assert localstripe.refunds_for(pay.provider_reference) == []

    # and a person says "succeeded" while the provider cannot be read: acknowledged, booked
    read_drill("*", times=10)
    first = services.operation_resolve_manual(
        operation_id=first.id,
        outcome="succeeded",
        reason="the buyer says the money arrived",
        actor="ledger-resolver",
        acting_user=resolver,
    )
    assert (first.outcome, first.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    services.provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    relay_drain()
    assert _provider_balance(purchase.id) == 1500 - 600

    # when the read-back finds no refund of it at the provider: the word is overturned
    first = services.operation_reconcile(operation_id=first.id)
    assert (first.outcome, first.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    assert OperationTransition.objects.filter(operation=first, cause=OVERTURN_CAUSE).exists()
    relay_drain()
    orchestrator.operation_settled(operation_id=first.id)  # handled twice: reversed once

    # then the ledger books what localstripe refunded (nothing), reversed row by row
    assert _refunded_at_localstripe(localstripe, pay) == 0
    assert _provider_balance(purchase.id) == 1500
    assert (
        LedgerEntry.objects.filter(operation_id=first.id, entry_type="refund_reversal").count() == 2
    )

    # and the freed room is refunded once, booked once
    again = _approved_refund(purchase, requester, approver, 1500)
    again = services.operation_dispatch(operation_id=again.id)
    assert again.outcome == Outcome.SUCCEEDED
    relay_drain()
    orchestrator.operation_settled(operation_id=again.id)
    assert _refunded_at_localstripe(localstripe, pay) == 1500
    assert len(localstripe.refunds_for(pay.provider_reference)) == 1
    assert _provider_balance(purchase.id) == 1500 - _refunded_at_localstripe(localstripe, pay)
    refunds_booked = LedgerEntry.objects.filter(
        purchase_id=purchase.id, account="provider_balance", entry_type__startswith="refund"
    ).aggregate(s=Sum("amount"))["s"]
    assert refunds_booked == -1500
    assert (
        PaymentOperation.objects.filter(
            parent=pay, kind="refund", outcome=Outcome.SUCCEEDED
        ).count()
        == 1
    )


def test_a_void_overturned_to_failed_is_unbooked(
    new_purchase, api_client, drill, read_drill, people, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver, _, _ = people
    # given an authorization, still standing at localstripe
    purchase = new_purchase(price=1500)
    auth = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        capture_method="manual",
    )
    auth = services.operation_dispatch(operation_id=auth.id)
    assert auth.outcome == Outcome.SUCCEEDED
    # and a void whose send the provider refused unapplied (409): unknown
    void = services.void_create(purchase_id=purchase.id)
    drill(void, DrillMode.HTTP_409, step="cancel")
    void = services.operation_dispatch(operation_id=void.id)
    assert void.outcome == Outcome.UNKNOWN
    # and a person says "succeeded" while the provider cannot be read: booked
    read_drill("*", times=10)
    void = services.operation_resolve_manual(
        operation_id=void.id,
        outcome="succeeded",
        reason="the dashboard showed it cancelled",
        actor="ledger-resolver",
        acting_user=resolver,
    )
    assert (void.outcome, void.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    services.provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    relay_drain()
    assert LedgerEntry.objects.filter(operation_id=void.id, entry_type="void").count() == 2

    # when the read-back shows the authorization still standing: overturned
    void = services.operation_reconcile(operation_id=void.id)
    assert (void.outcome, void.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    relay_drain()

    # then the void's booking is reversed: the ledger says what localstripe holds
    [pi] = localstripe.payment_intents_for(purchase.id)
    assert pi["status"] == "requires_capture"
    booked = (
        LedgerEntry.objects.filter(operation_id=void.id)
        .values_list("account")
        .annotate(s=Sum("amount"))
    )
    assert all(s == 0 for _, s in booked), list(booked)
    assert LedgerEntry.objects.filter(operation_id=void.id, entry_type="void_reversal").count() == 2
