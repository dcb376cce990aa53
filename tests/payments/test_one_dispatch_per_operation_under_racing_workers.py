"""One dispatch per operation, in both payment modes: the same pending payment dispatched
by several workers at once (a redelivered task, the backstop, a person's replay, the
reconciler), with the provider slow or not. One PaymentIntent, one charge, one claim of
each step, the operation settled once, its events gapless. Counted at localstripe."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from payments import services
from payments.enums import HoldState, Outcome
from payments.models import Hold, OperationTransition, PaymentOperation, ProviderCall
from tests.events.event_judge import event_rows, violations

from .one_call_helpers import provider_count, start

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["two_step", "one_call"])
def pay_mode(request, localstripe, settings):
    from tests.localstripe import one_call_off, one_call_on

    if request.param == "one_call":
        one_call_on(localstripe, settings)
        yield request.param
        one_call_off(localstripe)
    else:
        one_call_off(localstripe)
        yield request.param


@pytest.mark.parametrize("slow", [0, 1.0], ids=["prompt", "slow_provider"])
def test_racing_dispatchers_send_once(pay_mode, slow, new_purchase, api_client, localstripe):
    if pay_mode == "one_call" and slow:
        localstripe.idempotency(hold_seconds=slow)
    purchase = new_purchase()
    op = start(purchase, api_client)
    errors, results = [], []
    barrier = threading.Barrier(5)

    def run(fn):
        try:
            barrier.wait(10)
            results.append(fn())
        except services.DomainError as exc:
            results.append(exc.code)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    fns = [
        lambda: services.operation_dispatch(operation_id=op.id).outcome,
        lambda: services.operation_dispatch(operation_id=op.id).outcome,
        lambda: services.operation_dispatch(operation_id=op.id).outcome,
        lambda: services.operation_replay(operation_id=op.id, actor="support:test").outcome,
        lambda: services.operation_reconcile(operation_id=op.id).outcome,
    ]
    threads = [threading.Thread(target=run, args=(f,)) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if pay_mode == "one_call":
        localstripe.idempotency(hold_seconds=0)
    assert errors == [], errors
    op = PaymentOperation.objects.get(id=op.id)
    for _ in range(3):
        if op.outcome == Outcome.SUCCEEDED:
            break
        op = services.operation_reconcile(operation_id=op.id)
    print(pay_mode, slow, results, op.outcome)
    assert op.outcome == Outcome.SUCCEEDED
    assert provider_count(localstripe, purchase) == (1, 1, 1)
    steps = list(
        ProviderCall.objects.filter(operation=op, purpose="dispatch").values_list("step", "attempt")
    )
    assert len(steps) == len(set(steps)), steps
    assert (
        OperationTransition.objects.filter(
            operation=op, field="outcome", target=Outcome.SUCCEEDED
        ).count()
        == 1
    )
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED
    kinds = [e[2] for e in event_rows(purchase.id)]
    assert kinds.count("payment.succeeded") + kinds.count("payment.resolved") == 1, kinds
    assert violations(purchase.id) == []
