"""Races around a one-call payment's lost answer: the dead-dispatch sweep against a first
send still running at the provider, and two reconcilers re-sending at once."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from payments import services
from payments.enums import CallStep, HoldState, Outcome
from payments.models import Hold, OperationTransition, PaymentOperation

from .one_call_helpers import calls, provider_count, start, wait_intents

pytestmark = pytest.mark.django_db(transaction=True)


def _run(fn, errors, results):
    try:
        results.append(fn())
    except services.DomainError as exc:
        results.append(exc.code)
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        connection.close()


def test_sweep_races_a_slow_first_send(new_purchase, api_client, one_call):
    """The first send is still running at the provider (held 3 s) when its lease runs out:
    the sweep makes it unknown, the reconciler re-sends (409) and reads (nothing yet); then
    the first answer arrives. One payment, settled once, hold consumed."""
    one_call.idempotency(hold_seconds=3)
    purchase = new_purchase()
    op = start(purchase, api_client)
    errors, results = [], []
    t = threading.Thread(
        target=_run,
        args=(lambda: services.operation_dispatch(operation_id=op.id).outcome, errors, results),
    )
    t.start()
    wait_for_dispatching = timezone.now() + timedelta(seconds=5)
    while (
        PaymentOperation.objects.get(id=op.id).outcome != Outcome.DISPATCHING
        and timezone.now() < wait_for_dispatching
    ):
        pass
    PaymentOperation.objects.filter(id=op.id).update(
        dispatch_deadline=timezone.now() - timedelta(seconds=1)
    )
    assert services.operations_sweep_dead_dispatches() == 1
    one_call.idempotency(hold_seconds=0)
    mid = services.operation_reconcile(operation_id=op.id)
    t.join(20)
    assert errors == []
    op = PaymentOperation.objects.get(id=op.id)
    counts = provider_count(one_call, purchase)
    print(
        "mid:",
        mid.outcome,
        "worker:",
        results,
        "final:",
        op.outcome,
        "replays:",
        calls(op, "replay"),
        "provider:",
        counts,
    )
    assert counts == (1, 1, 1)
    assert op.outcome == Outcome.SUCCEEDED
    assert (
        OperationTransition.objects.filter(
            operation=op, field="outcome", target=Outcome.SUCCEEDED
        ).count()
        == 1
    )
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED


def test_two_reconcilers_resend_at_once(new_purchase, api_client, one_call):
    """A worker claimed the payment and died before anything left; swept to unknown; two
    reconcilers (the schedule and a person's replay) re-send together while the provider
    holds the first of them: one executes, the other meets 409. One payment."""
    purchase = new_purchase()
    op = start(purchase, api_client)
    services._claim(op.id, CallStep.PAY, from_pending=True, confirm=True)
    PaymentOperation.objects.filter(id=op.id).update(
        dispatch_deadline=timezone.now() - timedelta(seconds=1)
    )
    assert services.operations_sweep_dead_dispatches() == 1
    one_call.idempotency(hold_seconds=1.5)
    errors, results = [], []
    threads = [
        threading.Thread(target=_run, args=(f, errors, results))
        for f in (
            lambda: services.operation_reconcile(operation_id=op.id).outcome,
            lambda: services.operation_replay(operation_id=op.id, actor="support:bob").outcome,
        )
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    one_call.idempotency(hold_seconds=0)
    assert errors == []
    op = PaymentOperation.objects.get(id=op.id)
    if op.outcome != Outcome.SUCCEEDED:
        op = services.operation_reconcile(operation_id=op.id)
    counts = provider_count(one_call, purchase)
    print(
        "threads:",
        results,
        "final:",
        op.outcome,
        "replays:",
        calls(op, "replay"),
        "provider:",
        counts,
    )
    assert counts == (1, 1, 1)
    assert op.outcome == Outcome.SUCCEEDED
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED


def test_lost_decline_then_retry_with_another_card(
    new_purchase, api_client, one_call, drill, read_drill
):
    from payments.providers.stripe import DrillMode

    purchase = new_purchase()
    op = start(purchase, api_client, method="pm_card_chargeCustomerFail")
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=2)
    read_drill(times=1)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    refusals = []
    for kwargs in ({"retry_of": op.id}, {}):
        try:
            start(purchase, api_client, method="pm_card_visa", **kwargs)
            refusals.append("accepted")
        except services.DomainError as exc:
            refusals.append(exc.code)
    op = services.operation_reconcile(operation_id=op.id)
    assert (op.outcome, op.reason) == (Outcome.FAILED, "card_declined")
    retry = services.operation_dispatch(
        operation_id=start(purchase, api_client, method="pm_card_visa", retry_of=op.id).id
    )
    counts = provider_count(one_call, purchase)
    print("while unknown:", refusals, "retry:", retry.outcome, "provider:", counts)
    assert "accepted" not in refusals
    assert retry.outcome == Outcome.SUCCEEDED
    assert counts == (2, 1, 1)
    assert Hold.objects.get(operation=op).state == HoldState.RELEASED


def test_dedupe_turned_on_mid_flight_for_a_two_step_payment(
    new_purchase, api_client, localstripe, drill, settings
):
    """Sent in two steps (create, confirm) while the provider did not dedupe; its confirm's
    answer lost; then the deployment turns one-call on. The unknown payment must be read,
    never re-sent as a `pay`."""
    from payments.providers.stripe import DrillMode

    purchase = new_purchase()
    op = start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CONFIRM)
    op = services.operation_dispatch(operation_id=op.id)
    localstripe.idempotency(enabled="true", flush="true")
    settings.STRIPE_DEDUPES_KEYS = True
    try:
        op = services.operation_reconcile(operation_id=op.id)
        counts = provider_count(localstripe, purchase)
        print("final:", op.outcome, "replays:", calls(op, "replay"), "provider:", counts)
        assert calls(op, "replay") == []
        assert counts == (1, 1, 1) and op.outcome == Outcome.SUCCEEDED
    finally:
        localstripe.idempotency(enabled="false", flush="true")


def test_dedupe_turned_off_while_dispatching(new_purchase, api_client, one_call, settings):
    """The worker sent `pay` under one-call; before its (slow) answer, the deployment turns
    one-call off and the lease runs out. The sweep, then the reconciler, must read, and the
    first answer settles it."""
    one_call.idempotency(hold_seconds=2)
    purchase = new_purchase()
    op = start(purchase, api_client)
    errors, results = [], []
    t = threading.Thread(
        target=_run,
        args=(lambda: services.operation_dispatch(operation_id=op.id).outcome, errors, results),
    )
    t.start()
    wait_intents(one_call, purchase, 1, timeout=0.5)
    settings.STRIPE_DEDUPES_KEYS = False
    PaymentOperation.objects.filter(id=op.id).update(
        dispatch_deadline=timezone.now() - timedelta(seconds=1)
    )
    swept = services.operations_sweep_dead_dispatches()
    mid = PaymentOperation.objects.get(id=op.id)
    if mid.outcome == Outcome.UNKNOWN:
        services.operation_reconcile(operation_id=op.id)
    t.join(20)
    assert errors == []
    op = PaymentOperation.objects.get(id=op.id)
    counts = provider_count(one_call, purchase)
    print(
        "swept:",
        swept,
        "mid:",
        mid.outcome,
        mid.reason,
        "final:",
        op.outcome,
        "replays:",
        calls(op, "replay"),
        "provider:",
        counts,
    )
    assert mid.outcome != Outcome.FAILED
    assert counts == (1, 1, 1) and op.outcome == Outcome.SUCCEEDED


def test_a_409_on_the_first_send(new_purchase, api_client, one_call, drill):
    """The first send is answered 409 in progress (nothing learned; here nothing reached the
    provider): unknown, not asked at once; the schedule's re-send executes the one request
    the key allows. One payment."""
    from payments.providers.stripe import DrillMode

    purchase = new_purchase()
    op = start(purchase, api_client)
    drill(op, DrillMode.HTTP_409, step=CallStep.PAY)
    op = services.operation_dispatch(operation_id=op.id)
    first = (op.outcome, calls(op), calls(op, "replay"), provider_count(one_call, purchase))
    op = services.operation_reconcile(operation_id=op.id)
    counts = provider_count(one_call, purchase)
    print("after 409:", first, "final:", op.outcome, calls(op, "replay"), "provider:", counts)
    assert first[0] == Outcome.UNKNOWN and first[2] == [] and first[3] == (0, 0, 0)
    assert counts == (1, 1, 1) and op.outcome == Outcome.SUCCEEDED
