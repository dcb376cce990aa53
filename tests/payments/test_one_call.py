"""One round trip where the provider dedupes keys, on the real stack
(docs/reliability.md#one-round-trip-where-the-provider-dedupes-keys):
localstripe with Stripe's idempotency layer on, the real SDK, faults through the
fault-drill HTTP client. Every test counts PaymentIntents and charges at localstripe."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from payments import services
from payments.enums import CallStep, Grade, HoldState, Outcome, Rail, Verification
from payments.models import Hold, PaymentOperation, ProviderCall
from payments.providers.stripe import DrillMode
from recovery.halts import halt_clear, halt_set
from tests.localstripe import provider_object
from tests.webhooks.events import event_for, post

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_one_call"


def _start(purchase, api_client, method="pm_card_visa"):
    return services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=method
    )


def _calls(op, purpose="dispatch"):
    return list(
        ProviderCall.objects.filter(operation=op, purpose=purpose)
        .order_by("started_at")
        .values_list("step", "attempt", "classification")
    )


def _one_charge(localstripe, purchase):
    intents = localstripe.payment_intents_for(purchase.id)
    assert len(intents) == 1, intents
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    charges = [
        c for c in localstripe.list("charges") if c.get("payment_intent") == intents[0]["id"]
    ]
    assert len(charges) == 1
    return intents[0]


def _lose_answers(op, drill, read_drill, mode=DrillMode.DROP_RESPONSE_AFTER_SEND):
    """The first send and the dispatcher's immediate re-send both lose their answer, and
    its read by metadata cannot reach the provider: the payment is `unknown`."""
    drill(op, mode, step=CallStep.PAY, times=2)
    read_drill(times=1)
    return services.operation_dispatch(operation_id=op.id)


def test_a_payment_is_one_request_under_the_pay_key(new_purchase, api_client, one_call):
    purchase = new_purchase()
    op = services.operation_dispatch(operation_id=_start(purchase, api_client).id)
    assert (op.outcome, op.grade, op.verification) == (
        Outcome.SUCCEEDED,
        Grade.CONFIRMED,
        Verification.PROVIDER,
    )
    assert _calls(op) == [("pay", 1, "ok")]
    assert ProviderCall.objects.get(operation=op).key == f"{op.idempotency_key}:pay"
    intent = _one_charge(one_call, purchase)
    assert op.provider_reference == intent["id"]
    assert intent["metadata"]["operation_id"] == op.id
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED


def test_without_a_deduping_provider_it_stays_create_then_confirm(
    new_purchase, api_client, localstripe
):
    purchase = new_purchase()
    op = services.operation_dispatch(operation_id=_start(purchase, api_client).id)
    assert op.outcome == Outcome.SUCCEEDED
    assert _calls(op) == [("create", 1, "ok"), ("confirm", 1, "ok")]
    _one_charge(localstripe, purchase)


@pytest.mark.parametrize(
    "mode", [DrillMode.DROP_RESPONSE_AFTER_SEND, DrillMode.RESET_AFTER_WRITE, DrillMode.HTTP_500]
)
def test_a_lost_answer_is_asked_again_under_the_same_key(
    mode, new_purchase, api_client, one_call, drill
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, mode, step=CallStep.PAY)
    op = services.operation_dispatch(operation_id=op.id)
    # The provider charged once; the re-send was answered from its record of the key.
    assert (op.outcome, op.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    assert _calls(op) == [("pay", 1, "unknown")]
    assert _calls(op, "replay") == [("pay", 1, "ok")]
    keys = set(ProviderCall.objects.filter(operation=op, step="pay").values_list("key", flat=True))
    assert keys == {f"{op.idempotency_key}:pay"}
    assert op.provider_reference == _one_charge(one_call, purchase)["id"]
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED


def test_a_lost_answer_and_a_lost_resend_stay_unknown_then_the_reconciler_resends(
    new_purchase, api_client, one_call, drill, read_drill
):
    purchase = new_purchase()
    op = _lose_answers(_start(purchase, api_client), drill, read_drill)
    assert op.outcome == Outcome.UNKNOWN and not op.provider_reference
    assert Hold.objects.get(operation=op).state == HoldState.RESERVED
    # Asked again later, still inside the window: the provider's stored answer.
    op = services.operation_reconcile(operation_id=op.id)
    assert (op.outcome, op.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    assert [c for _, _, c in _calls(op, "replay")] == ["unknown", "ok"]
    _one_charge(one_call, purchase)


def test_an_answer_never_sent_is_sent_again_under_the_same_key(
    new_purchase, api_client, one_call, drill
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.TIMEOUT_BEFORE_SEND, step=CallStep.PAY)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    assert _calls(op) == [("pay", 1, "not_sent"), ("pay", 2, "ok")]
    _one_charge(one_call, purchase)


def test_a_worker_dead_after_sending_is_unknown_never_failed(new_purchase, api_client, one_call):
    """The claim stored the first-send time before the request left: a dead dispatch of
    a one-call payment may have charged, so the sweep makes it `unknown`, and the re-send
    recovers it."""
    purchase = new_purchase()
    op = _start(purchase, api_client)
    call = services._claim(op.id, CallStep.PAY, from_pending=True, confirm=True)
    provider = services.provider_for_rail(Rail.STRIPE)
    provider.create_and_confirm_payment_intent(key=call.key, **services.common.payment_request(op))
    # ...and the worker dies. Its lease runs out:
    PaymentOperation.objects.filter(id=op.id).update(
        dispatch_deadline=timezone.now() - timedelta(seconds=1)
    )
    assert services.operations_sweep_dead_dispatches() == 1
    op = PaymentOperation.objects.get(id=op.id)
    assert op.outcome == Outcome.UNKNOWN and op.reason == ""
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    _one_charge(one_call, purchase)


def test_a_lost_decline_is_the_stored_decline(new_purchase, api_client, one_call, drill):
    purchase = new_purchase()
    op = _start(purchase, api_client, method="pm_card_chargeCustomerFail")
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY)
    op = services.operation_dispatch(operation_id=op.id)
    assert (op.outcome, op.reason, op.verification) == (
        Outcome.FAILED,
        "card_declined",
        Verification.PROVIDER,
    )
    assert _calls(op, "replay") == [("pay", 1, "declined")]
    assert len(one_call.payment_intents_for(purchase.id)) == 1
    assert one_call.succeeded_charges_for(purchase.id) == []
    assert Hold.objects.get(operation=op).state == HoldState.RELEASED


def test_past_the_window_edge_nothing_is_resent_and_reading_decides(
    new_purchase, api_client, one_call, drill, settings, read_drill
):
    """The provider forgets the key after its window; a re-send then would be a second
    payment. Verity stops re-sending a margin before the edge and reads instead."""
    settings.STRIPE_IDEMPOTENCY_WINDOW_SECONDS = 3
    settings.STRIPE_RESEND_MARGIN_SECONDS = 1
    one_call.idempotency(window_seconds=3)
    purchase = new_purchase()
    op = _lose_answers(_start(purchase, api_client), drill, read_drill)
    assert op.outcome == Outcome.UNKNOWN and len(_calls(op, "replay")) == 1
    first_send = op.confirm_claimed_at
    while timezone.now() - first_send < timedelta(seconds=3.2):
        time.sleep(0.1)  # past Verity's usable window and past the provider's
    op = services.operation_reconcile(operation_id=op.id)
    # A re-send now would meet a provider that forgot the key: a second PaymentIntent.
    assert len(one_call.payment_intents_for(purchase.id)) == 1
    assert len(_calls(op, "replay")) == 1  # nothing re-sent after the edge
    assert (op.outcome, op.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    assert ProviderCall.objects.filter(
        operation=op, purpose="reconcile", step="list"
    ).exists()  # read by metadata
    _one_charge(one_call, purchase)


def test_the_window_edge_is_the_providers_minus_the_margin(
    new_purchase, api_client, one_call, drill, settings, read_drill
):
    settings.STRIPE_IDEMPOTENCY_WINDOW_SECONDS = 4
    settings.STRIPE_RESEND_MARGIN_SECONDS = 3
    purchase = new_purchase()
    op = _lose_answers(_start(purchase, api_client), drill, read_drill)
    while timezone.now() - op.confirm_claimed_at < timedelta(seconds=1.1):
        time.sleep(0.05)
    # Still inside the provider's window, but inside the margin: read, do not re-send.
    op = services.operation_reconcile(operation_id=op.id)
    assert len(_calls(op, "replay")) == 1 and op.outcome == Outcome.SUCCEEDED
    _one_charge(one_call, purchase)


def test_a_halt_between_send_and_resend_holds_the_resend(
    new_purchase, api_client, one_call, drill, read_drill
):
    purchase = new_purchase()
    op = _lose_answers(_start(purchase, api_client), drill, read_drill)
    assert op.outcome == Outcome.UNKNOWN
    halt_set(name="checkout", reason="incident", actor="ops")
    read_drill(times=1)  # and the read cannot decide either
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    assert len(_calls(op, "replay")) == 1  # the halt let no re-send leave
    halt_clear(name="checkout", actor="ops", reason="over")
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    assert [c for _, _, c in _calls(op, "replay")] == ["unknown", "ok"]
    _one_charge(one_call, purchase)


def test_a_resend_racing_the_webhook_settles_once(
    new_purchase, api_client, one_call, drill, client, settings, read_drill
):
    from payments.models import OperationTransition
    from webhooks.models import ProviderEvent
    from webhooks.services import event_process

    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = ""
    purchase = new_purchase()
    op = _lose_answers(_start(purchase, api_client), drill, read_drill)
    intent = one_call.payment_intents_for(purchase.id)[0]
    event = event_for(provider_object("payment_intents", intent["id"]), "payment_intent.succeeded")
    assert post(client, event, secret=SECRET).status_code == 200
    stored = ProviderEvent.objects.get(event_id=event["id"])
    errors = []

    def run(fn):
        try:
            fn()
        except services.DomainError:
            pass  # the other one settled it first
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=(f,))
        for f in (
            lambda: event_process(event_id=stored.pk),
            lambda: services.operation_reconcile(operation_id=op.id),
        )
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    op = PaymentOperation.objects.get(id=op.id)
    assert op.outcome == Outcome.SUCCEEDED and op.provider_reference == intent["id"]
    assert (
        OperationTransition.objects.filter(
            operation=op, field="outcome", target=Outcome.SUCCEEDED
        ).count()
        == 1
    )
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED
    _one_charge(one_call, purchase)


def test_a_key_still_in_progress_answers_409_and_is_asked_later(
    new_purchase, api_client, one_call, settings
):
    """The provider is still executing the first request (held 1.5 s) when Verity's read
    timeout gives up and its re-send arrives: 409, nothing learned, unknown; once the first
    request finished, the re-send gets its answer. Still one payment."""
    settings.STRIPE_READ_TIMEOUT = 0.5
    one_call.idempotency(hold_seconds=1.5)
    purchase = new_purchase()
    op = services.operation_dispatch(operation_id=_start(purchase, api_client).id)
    assert op.outcome == Outcome.UNKNOWN
    replay = ProviderCall.objects.get(operation=op, purpose="replay")
    assert (replay.classification, replay.http_status) == ("unknown", 409)
    one_call.idempotency(hold_seconds=0)
    deadline = time.monotonic() + 10
    while not one_call.payment_intents_for(purchase.id) and time.monotonic() < deadline:
        time.sleep(0.1)  # the first request finishes executing at the provider
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    _one_charge(one_call, purchase)


def test_a_provider_that_stops_deduping_is_never_resent(
    new_purchase, api_client, one_call, drill, settings, read_drill
):
    purchase = new_purchase()
    op = _lose_answers(_start(purchase, api_client), drill, read_drill)
    settings.STRIPE_DEDUPES_KEYS = False
    op = services.operation_reconcile(operation_id=op.id)
    assert len(_calls(op, "replay")) == 1
    assert op.outcome == Outcome.SUCCEEDED
    _one_charge(one_call, purchase)


def test_a_replay_of_an_unknown_one_call_payment_is_its_resend(
    new_purchase, api_client, one_call, drill, read_drill
):
    purchase = new_purchase()
    op = _lose_answers(_start(purchase, api_client), drill, read_drill)
    assert op.outcome == Outcome.UNKNOWN
    op = services.operation_replay(operation_id=op.id, actor="operator")
    assert (op.outcome, op.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    assert [c for _, _, c in _calls(op, "replay")] == ["unknown", "ok"]
    _one_charge(one_call, purchase)


def test_the_reconcile_sweep_resends_one_call_payments_one_by_one(
    new_purchase, api_client, one_call, drill, read_drill
):
    from recovery.sweep import reconcile_sweep

    lost = []
    for _ in range(2):
        purchase = new_purchase()
        lost.append((purchase, _lose_answers(_start(purchase, api_client), drill, read_drill)))
    result = reconcile_sweep(operation_ids=[op.id for _, op in lost])
    assert result.reconciled == 2 and result.failed == 0
    for purchase, op in lost:
        op = PaymentOperation.objects.get(id=op.id)
        assert op.outcome == Outcome.SUCCEEDED
        assert [c for _, _, c in _calls(op, "replay")] == ["unknown", "ok"]
        _one_charge(one_call, purchase)
