"""The key window's edge and halts around a one-call payment's lost answer. (A window
setting longer than the provider keeps keys, or no margin, is refused at start-up against
a real provider: tests/security/test_startup_refusals.py.)"""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation
from recovery.halts import halt_clear, halt_set

from .one_call_helpers import calls, provider_count, start

pytestmark = pytest.mark.django_db(transaction=True)


def _lose(op, drill, read_drill):
    from payments.enums import CallStep
    from payments.providers.stripe import DrillMode

    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=2)
    read_drill(times=1)
    return services.operation_dispatch(operation_id=op.id)


def _wait_until_the_key_is_free(key: str, op, *, bound_seconds: float = 15.0) -> None:
    """Until the provider has finished the first request under `key`: the same request sent
    again is answered from the key's record (not 409 `idempotency_key_in_use`). Sent
    straight through the adapter: Verity records nothing and no payment is added."""
    from payments.enums import Rail

    provider = services.provider_for_rail(Rail.STRIPE)
    request = services.common.payment_request(op)
    deadline = time.monotonic() + bound_seconds
    while True:
        answer = provider.create_and_confirm_payment_intent(key=key, **request)
        if answer.http_status != 409:
            assert answer.replayed, answer
            return
        assert time.monotonic() < deadline, "the provider still runs the first request"
        time.sleep(0.05)


def test_the_margin_keeps_the_last_resend_inside_the_window(
    new_purchase, api_client, one_call, drill, read_drill, settings
):
    """Re-sent at the edge until refused: Verity stops re-sending a margin before the
    provider's window closes, so its last re-send still finds the key, however long it took
    from the decision to the provider. With no margin that holds only while a re-send
    reaches the provider faster than the first send did after its claim: under load a
    re-send arrived after the key expired and made a second payment (seen in a loaded
    full run), which is why a margin of 0 refuses to start."""
    one_call.idempotency(window_seconds=3)
    settings.STRIPE_IDEMPOTENCY_WINDOW_SECONDS = 3
    settings.STRIPE_RESEND_MARGIN_SECONDS = 1
    purchase = new_purchase()
    op = _lose(start(purchase, api_client), drill, read_drill)
    deadline = op.confirm_claimed_at + timedelta(seconds=3.5)
    while timezone.now() < deadline:
        op = PaymentOperation.objects.get(id=op.id)
        if op.outcome != Outcome.UNKNOWN:
            # settled by a re-send: make it unknown again to keep re-sending at the edge
            PaymentOperation.objects.filter(id=op.id).update(
                outcome=Outcome.UNKNOWN, provider_reference=""
            )
        services.operation_reconcile(operation_id=op.id)
    counts = provider_count(one_call, purchase)
    print("re-sends:", len(calls(op, "replay")), "provider:", counts)
    assert counts == (1, 1, 1)


def test_a_halt_set_while_the_first_send_runs(new_purchase, api_client, one_call, settings):
    """The first send is running at the provider (held 2 s, Verity's read timeout 0.5 s);
    checkout is halted before the dispatcher asks again. No re-send leaves while halted;
    the read decides once the provider finished; one payment."""
    settings.STRIPE_READ_TIMEOUT = 0.5
    one_call.idempotency(hold_seconds=2)
    purchase = new_purchase()
    op = start(purchase, api_client)
    halt_set(name="checkout", reason="incident", actor="ops")
    # claimed before the halt: dispatch the already-claimed payment's send by hand
    from payments.enums import CallStep, Rail

    call = None
    halt_clear(name="checkout", actor="ops", reason="claim")
    call = services._claim(op.id, CallStep.PAY, from_pending=True, confirm=True)
    halt_set(name="checkout", reason="incident", actor="ops")
    result = services.provider_for_rail(Rail.STRIPE).create_and_confirm_payment_intent(
        key=call.key, **services.common.payment_request(op)
    )
    services.dispatch._record_call(call, result)
    services.dispatch._outcome_after_call(op, CallStep.PAY, result)
    try:
        services.operation_reconcile(operation_id=op.id)
    except services.DomainError:
        pass
    held = calls(op, "replay")
    one_call.idempotency(hold_seconds=0)
    _wait_until_the_key_is_free(call.key, op)
    op = services.operation_reconcile(operation_id=op.id)
    halt_clear(name="checkout", actor="ops", reason="over")
    counts = provider_count(one_call, purchase)
    print(
        "first:",
        result.classification,
        "replays while halted:",
        held,
        "final:",
        op.outcome,
        "provider:",
        counts,
    )
    assert held == []
    assert counts == (1, 1, 1) and op.outcome == Outcome.SUCCEEDED


def test_a_person_replays_mid_flight(new_purchase, api_client, one_call):
    """A person replays the payment while its first send is still out: refused (only an
    unknown payment is replayed); nothing leaves twice."""
    one_call.idempotency(hold_seconds=1.5)
    purchase = new_purchase()
    op = start(purchase, api_client)
    out = []

    def dispatch():
        try:
            out.append(services.operation_dispatch(operation_id=op.id).outcome)
        finally:
            connection.close()

    t = threading.Thread(target=dispatch)
    t.start()
    while PaymentOperation.objects.get(id=op.id).outcome == Outcome.PENDING:
        time.sleep(0.02)
    try:
        services.operation_replay(operation_id=op.id, actor="support:carol")
        replay = "accepted"
    except services.DomainError as exc:
        replay = exc.code
    t.join(20)
    one_call.idempotency(hold_seconds=0)
    counts = provider_count(one_call, purchase)
    print("replay:", replay, "dispatch:", out, "provider:", counts, "replays:", calls(op, "replay"))
    assert replay != "accepted" and calls(op, "replay") == []
    assert counts == (1, 1, 1) and out == [Outcome.SUCCEEDED]
