"""Invariants 1 and 2 under concurrency and a dead worker."""

import signal
import threading

import pytest
from django.db import connections

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation, ProviderCall
from tests.hanging_dispatch import start_hanging_dispatch
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_fifty_concurrent_attempts_make_exactly_one_charge(new_purchase, api_client, localstripe):
    purchase = new_purchase()
    results, barrier = [], threading.Barrier(50)

    def attempt(i):
        try:
            barrier.wait()
            amount = None if i % 5 else purchase.amount + i  # some vary the amount
            op = services.payment_create(
                purchase_id=purchase.id,
                api_client=api_client,
                payment_method="pm_card_visa",
                amount=amount,
            )
            results.append(services.operation_dispatch(operation_id=op.id).outcome)
        except services.DomainError as exc:
            results.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 50
    assert results.count(Outcome.SUCCEEDED) == 1
    assert set(results) <= {
        Outcome.SUCCEEDED,
        "payment_unresolved",
        "already_paid",
        "amount_mismatch",
    }
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1


@pytest.mark.alone  # a child interpreter must charge within 30 s (make test runs xdist workers)
def test_worker_killed_after_send_leaves_unknown_then_reconciled(
    new_purchase, api_client, localstripe, settings
):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    child = start_hanging_dispatch(op.id)
    try:
        wait_for(lambda: localstripe.succeeded_charges_for(purchase.id), timeout=30)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    op = PaymentOperation.objects.get(id=op.id)
    assert op.outcome == Outcome.DISPATCHING and op.confirm_claimed_at is not None

    wait_for(
        lambda: (
            services.operations_sweep_dead_dispatches()
            or PaymentOperation.objects.get(id=op.id).outcome != Outcome.DISPATCHING
        ),
        timeout=10,
    )
    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.UNKNOWN
    services.operation_dispatch(operation_id=op.id)  # never dispatched again
    assert (
        ProviderCall.objects.filter(operation_id=op.id, purpose="dispatch", step="confirm").count()
        == 1
    )
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED and op.verification == "provider"
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
