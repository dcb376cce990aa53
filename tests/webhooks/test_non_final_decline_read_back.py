"""A non-final decline is read back, not applied.

A signed `payment_intent.payment_failed` whose PaymentIntent is back in
`requires_payment_method` (not the provider's last word) no longer fails an unsettled
payment by itself: `webhooks.services._verify_failure_outside_transaction` reads the payment
back and the provider's record decides. Attacked here on the real stack: payments made at
localstripe through the real SDK, faults from the fault-drill HTTP client (`drill`,
`read_drill`), events signed with the endpoint's secret and delivered through the real
endpoint. Effects are counted at localstripe (PaymentIntents, charges) and in the database
(operations, history, events, outbox rows), not read off responses.

Five breaks, each a strict xfail on 28ee2dd. Three pass since
payments.services.observations.outcome_apply_locked confirms a person's word only on the
provider's last word (`final`). Two (section 2: a payment settled failed on a declined
3-D Secure attempt, whose PaymentIntent is then paid outside Verity) pass since Verity
cancels a payment it settled failed that the provider still holds open
(payments.services.cancels, through the outbox: the relay runs before the buyer comes
back). An automatic overturn of such a failure was tried and withdrawn after a second
attack (a cancelled purchase, a retry still pending, a person's unconfirmed retry).
"""

import threading

import pytest
import requests
from django.conf import settings
from django.db import connection

from payments import services
from payments.enums import Grade, Outcome, PurchaseStatus, Rail, Verification
from payments.models import OperationTransition, PaymentOperation, Purchase
from recovery.models import OutboxCategory, OutboxMessage
from tests.localstripe import provider_object
from tests.webhooks.events import event_for, post
from webhooks.models import EventResult, ProviderEvent
from webhooks.services import HELD_MAX_ATTEMPTS, event_process

pytestmark = pytest.mark.django_db(transaction=True)

PAID_OR_LATER = (PurchaseStatus.PAID, PurchaseStatus.FULFILLING, PurchaseStatus.COMPLETED)


def _reload(op) -> PaymentOperation:
    return PaymentOperation.objects.select_related("purchase").get(pk=op.pk)


def _stored(event) -> ProviderEvent:
    return ProviderEvent.objects.get(event_id=event["id"])


def _ingest(client, event) -> int:
    response = post(client, event)
    assert response.status_code == 200, response.content
    return _stored(event).pk


def _deliver(client, event) -> str:
    return event_process(event_id=_ingest(client, event))


def _stale_decline(pi: dict, *, age: int = 60) -> dict:
    """A signed event of an earlier failed attempt of this PaymentIntent (the provider does
    not order its deliveries): the same object as it was before the success."""
    stale = {
        **pi,
        "status": "requires_payment_method",
        "last_payment_error": {"code": "card_declined", "message": "declined"},
    }
    event = event_for(stale, "payment_intent.payment_failed")
    event["created"] -= age
    return event


def _run_steps(purchase) -> int:
    return OutboxMessage.objects.filter(
        category=OutboxCategory.RUN_STEPS, payload={"purchase": purchase.pk}
    ).count()


def _provider_reads_back():
    from payments.services import provider_for_rail

    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()


def _ls(method: str, path: str, **data) -> requests.Response:
    return requests.request(
        method,
        f"{settings.STRIPE_API_BASE}{path}",
        data=data,
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )


def _three_d_secure_method() -> str:
    r = _ls(
        "POST",
        "/v1/payment_methods",
        type="card",
        **{
            "card[number]": "4000002760003184",
            "card[exp_month]": "12",
            "card[exp_year]": "2030",
            "card[cvc]": "123",
        },
    )
    r.raise_for_status()
    return r.json()["id"]


@pytest.fixture
def person(django_user_model):
    return django_user_model.objects.create(username="decline-resolver")


def _person_says(op, outcome: str, person):
    """A person's resolution while the provider cannot be read (acknowledged)."""
    return services.operation_resolve_manual(
        operation_id=op.id,
        outcome=outcome,
        reason="buyer says declined",
        actor=person.username,
        acting_user=person,
    )


def _charged_answer_lost(new_purchase, pay):
    """(purchase, operation, PaymentIntent): charged at the provider, its answer lost
    (`unknown` at Verity)."""
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    return purchase, op, provider_object("payment_intents", op.provider_reference)


# -- 1. Was broken: a stale decline turns a person's "failed" into the provider's word -------------


# a non-final stale decline upgrades a
# person's acknowledged 'failed' to confirmed (outcome_apply_locked same-outcome upgrade
# ignores final): the read-back that would overturn it is refused and the success is
# quarantined; charged, Verity says failed
def test_a_stale_decline_does_not_confirm_a_persons_failed_on_a_charged_payment(
    client, new_purchase, pay, read_drill, person, localstripe
):
    # given a payment the provider charged whose answer was lost (unknown), resolved
    # "failed" by a person while the provider could not be read (acknowledged, the person's
    # word: the provider's record is to outrank it once it can be read)
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    assert op.outcome == Outcome.UNKNOWN
    pi = provider_object("payment_intents", op.provider_reference)
    assert pi["status"] == "succeeded"
    read_drill(op.provider_reference, times=1)
    op = _person_says(op, "failed", person)
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.ACKNOWLEDGED)

    # when an older signed decline of the same PaymentIntent arrives first, then the success
    stale = _stale_decline(pi)
    stale_result = _deliver(client, stale)
    success_result = _deliver(client, event_for(pi, "payment_intent.succeeded"))
    op = _reload(op)
    print(
        "stale:",
        stale_result,
        _stored(stale).result_reason,
        "| success:",
        success_result,
        "| op:",
        op.outcome,
        op.grade,
        op.verification,
    )

    # then the provider's record (succeeded) stands: the non-final decline settled nothing
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert Purchase.objects.get(pk=purchase.pk).status in PAID_OR_LATER
    assert _run_steps(purchase) == 1


def test_control_without_the_stale_decline_the_success_overturns_the_persons_failed(
    client, new_purchase, pay, read_drill, person, localstripe
):
    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    read_drill(op.provider_reference, times=1)
    _person_says(op, "failed", person)

    assert _deliver(client, event_for(pi, "payment_intent.succeeded")) == EventResult.APPLIED

    op = _reload(op)
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert _run_steps(purchase) == 1


# a decline held during a read outage is
# retried when a person settles the payment 'failed' (held_events_retry_now) and then
# confirms that word without any read: the charged payment ends confirmed failed, the
# success quarantined
def test_a_held_stale_decline_does_not_confirm_the_failed_a_person_gave_during_the_outage(
    client, new_purchase, pay, read_drill, person, localstripe
):
    from recovery.relay import relay_drain

    # given a charged payment (answer lost) and an older decline held while the provider
    # cannot be read
    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    read_drill(op.provider_reference, times=1000)
    stale = _stale_decline(pi)
    assert _deliver(client, stale) == EventResult.HELD
    assert _stored(stale).result_reason == "payment_not_settled"

    # when, still in the outage, a person settles it "failed" (acknowledged), and the
    # held event is retried at once because the payment settled
    _person_says(op, "failed", person)
    relay_drain()
    held = _stored(stale)
    after_retry = _reload(op)
    print(
        "held event:",
        held.result,
        held.result_reason,
        "| op:",
        after_retry.outcome,
        after_retry.grade,
        after_retry.verification,
    )
    # and the provider answers again; its success is delivered
    _provider_reads_back()
    success = _deliver(client, event_for(pi, "payment_intent.succeeded"))
    op = _reload(op)
    print("success event:", success, "| op:", op.outcome, op.grade)

    # then the provider's record stands: a person's word was never made the provider's
    # by an event that is not the provider's last word
    assert after_retry.grade == Grade.ACKNOWLEDGED
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert _run_steps(purchase) == 1


# after a stale decline confirmed a
# person's 'failed', the acknowledged follow-up read-back is refused (already settled):
# nothing reads the charged payment again
def test_after_a_stale_decline_the_persons_failed_is_still_read_back(
    client, new_purchase, pay, read_drill, person, localstripe
):
    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    read_drill(op.provider_reference, times=1)
    _person_says(op, "failed", person)
    _deliver(client, _stale_decline(pi))

    # the person's word is to be read back (its scheduled follow-up): the provider decides
    try:
        op = services.operation_reconcile(operation_id=op.id)
    except services.DomainError as exc:
        print("reconcile refused:", exc.code)
        op = _reload(op)
    assert op.outcome == Outcome.SUCCEEDED
    assert _run_steps(purchase) == 1


# -- 2. Was broken: the read-back "agrees" with a record that is not final -----


# a failed 3-D Secure read back as requires_payment_method was settled
# failed without cancelling the still-payable PaymentIntent; paid later on that same
# intent, Verity kept 'failed' (confirmed) and quarantined the success: charged, no order
def test_a_declined_3ds_read_back_failed_leaves_no_payable_intent_behind(
    client, new_purchase, api_client, localstripe
):
    from recovery.relay import relay_drain

    # given a payment awaiting the buyer's 3-D Secure
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_three_d_secure_method()
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.AWAITING_BUYER
    ref = op.provider_reference
    secret = provider_object("payment_intents", ref)["client_secret"]
    # the buyer fails the challenge: the intent is back in requires_payment_method
    _ls(
        "POST", f"/v1/payment_intents/{ref}/_authenticate", client_secret=secret, success="false"
    ).raise_for_status()
    declined = provider_object("payment_intents", ref)
    assert declined["status"] == "requires_payment_method" and declined["last_payment_error"]

    # when its decline is delivered: the read-back agrees (the record is the same)
    event = event_for(declined, "payment_intent.payment_failed")
    assert _deliver(client, event) == EventResult.APPLIED
    assert _stored(event).result_reason == "readback_agrees"
    op = _reload(op)
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    relay_drain()  # the follow-ups of the settled failure

    # and the buyer, still on the provider's page, pays the same intent with another card
    _ls("POST", f"/v1/payment_intents/{ref}", payment_method="pm_card_visa")
    _ls("POST", f"/v1/payment_intents/{ref}/confirm")
    now = provider_object("payment_intents", ref)
    result = None
    if now["status"] == "succeeded":
        result = _deliver(client, event_for(now, "payment_intent.succeeded"))
    op = _reload(op)
    print(
        "intent now:",
        now["status"],
        "| success event:",
        result,
        "| op:",
        op.outcome,
        op.grade,
        "| charges:",
        len(localstripe.succeeded_charges_for(purchase.id)),
    )

    # then Verity never says failed of an intent the provider charged
    assert not (now["status"] == "succeeded" and op.outcome == Outcome.FAILED)


# after a 3-D Secure decline read back 'failed', the client's retry
# charged a new intent and the old, never cancelled, intent was paid too: two charges
# kept, the second's success quarantined instead of compensated as a duplicate
def test_a_declined_3ds_then_a_retry_never_keeps_two_charges(
    client, new_purchase, api_client, localstripe
):
    from recovery.relay import relay_drain

    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_three_d_secure_method()
    )
    op = services.operation_dispatch(operation_id=op.id)
    ref = op.provider_reference
    secret = provider_object("payment_intents", ref)["client_secret"]
    _ls(
        "POST", f"/v1/payment_intents/{ref}/_authenticate", client_secret=secret, success="false"
    ).raise_for_status()
    declined = provider_object("payment_intents", ref)
    assert (
        _deliver(client, event_for(declined, "payment_intent.payment_failed"))
        == EventResult.APPLIED
    )
    assert _reload(op).outcome == Outcome.FAILED
    relay_drain()  # the follow-ups of the settled failure

    # the storefront retries (a new operation, a new intent): paid
    retry = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        retry_of=op.id,
    )
    retry = services.operation_dispatch(operation_id=retry.id)
    assert retry.outcome == Outcome.SUCCEEDED
    # and the buyer, on the provider's page of the first intent, pays that one as well
    _ls("POST", f"/v1/payment_intents/{ref}", payment_method="pm_card_visa")
    _ls("POST", f"/v1/payment_intents/{ref}/confirm")
    first = provider_object("payment_intents", ref)
    result = None
    if first["status"] == "succeeded":
        result = _deliver(client, event_for(first, "payment_intent.succeeded"))
    for _ in range(5):
        if not relay_drain():
            break
    kept = [
        pi
        for pi in localstripe.succeeded_charges_for(purchase.id)
        if not any(r["status"] == "succeeded" for r in localstripe.refunds_for(pi["id"]))
    ]
    print(
        "first intent:",
        first["status"],
        "| its success event:",
        result,
        "| charges kept:",
        len(kept),
        "| op:",
        _reload(op).outcome,
    )

    # then one purchase keeps at most one charge (a second is a duplicate, refunded)
    assert len(kept) == 1


# -- 3. probes that held -----------------------------------------------------------------------


def test_a_stale_decline_waits_out_a_long_read_outage_then_the_success_stands(
    client, new_purchase, pay, read_drill, localstripe
):
    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    stale = _stale_decline(pi)
    read_drill(op.provider_reference, times=1000)
    pk = _ingest(client, stale)

    # more retries than the attempts limit of unmatched events: still held, never quarantined
    for _ in range(HELD_MAX_ATTEMPTS + 3):
        assert event_process(event_id=pk) == EventResult.HELD
    row = _stored(stale)
    assert (row.result_reason, row.attempts) == ("payment_not_settled", HELD_MAX_ATTEMPTS + 3)
    assert _reload(op).outcome == Outcome.UNKNOWN
    # every retry has its successor queued, and the payment's read-back is queued (owners)
    assert (
        OutboxMessage.objects.filter(
            category=OutboxCategory.PROCESS_EVENT,
            processed_at__isnull=True,
            dedupe_key=f"event:{stale['id']}:held:{HELD_MAX_ATTEMPTS + 3}",
        ).count()
        == 1
    )
    assert OutboxMessage.objects.filter(
        category=OutboxCategory.RECONCILE, payload={"operation": op.pk}
    ).exists()
    # and a person can see it: the console's held queue, the gauge the alert reads
    from recovery.metrics import DatabaseCollector
    from support.selectors import queue_items

    assert [i.ref for i in queue_items("held")] != []
    metrics = {m.name: m for m in DatabaseCollector().collect()}
    assert metrics["verity_webhook_held_events"].samples[0].value == 1

    # the provider answers again: the next retry finds the success
    _provider_reads_back()
    assert event_process(event_id=pk) == EventResult.IGNORED
    assert _stored(stale).result_reason == "superseded_by_readback"
    op = _reload(op)
    assert (op.outcome, op.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    assert not OperationTransition.objects.filter(
        operation_id=op.pk, target=Outcome.FAILED
    ).exists()
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert _run_steps(purchase) == 1


def test_a_stale_decline_of_an_authorization_is_superseded_by_requires_capture(
    client, new_purchase, pay, localstripe
):
    purchase = new_purchase()
    op = pay(purchase, drop_response=True, capture="manual")
    assert op.outcome == Outcome.UNKNOWN
    pi = provider_object("payment_intents", op.provider_reference)
    assert pi["status"] == "requires_capture"
    stale = _stale_decline(pi)

    assert _deliver(client, stale) == EventResult.IGNORED

    assert _stored(stale).result_reason == "superseded_by_readback"
    assert _reload(op).outcome == Outcome.SUCCEEDED
    assert Purchase.objects.get(pk=purchase.pk).status not in (PurchaseStatus.PAYMENT_FAILED,)


def test_a_stale_decline_during_an_unknown_capture_settles_nothing(
    client, new_purchase, pay, api_client, drill, localstripe
):
    purchase = new_purchase()
    auth = pay(purchase, capture="manual")
    assert auth.outcome == Outcome.SUCCEEDED
    capture = services.capture_create(purchase_id=purchase.id, api_client=api_client)
    drill(capture, "drop_response_after_send", step="capture")
    capture = services.operation_dispatch(operation_id=capture.id)
    pi = provider_object("payment_intents", auth.provider_reference)
    stale = _stale_decline(pi, age=120)

    result = _deliver(client, stale)

    assert result in (EventResult.IGNORED, EventResult.HELD)
    assert _reload(auth).outcome == Outcome.SUCCEEDED
    assert _reload(capture).outcome != Outcome.FAILED


def test_two_workers_processing_the_same_stale_decline_settle_it_once(
    client, new_purchase, pay, localstripe
):
    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    pk = _ingest(client, _stale_decline(pi))
    success_pk = _ingest(client, event_for(pi, "payment_intent.succeeded"))
    results, errors = [], []
    barrier = threading.Barrier(3)

    def work(event_pk):
        try:
            barrier.wait()
            results.append(event_process(event_id=event_pk))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(p,)) for p in (pk, pk, success_pk)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert not errors, errors
    op = _reload(op)
    assert op.outcome == Outcome.SUCCEEDED
    assert not OperationTransition.objects.filter(
        operation_id=op.pk, target=Outcome.FAILED
    ).exists()
    assert ProviderEvent.objects.get(pk=pk).result in (EventResult.IGNORED, EventResult.APPLIED)
    assert ProviderEvent.objects.get(pk=pk).result_reason != "readback_agrees"
    assert ProviderEvent.objects.get(pk=success_pk).result != EventResult.QUARANTINED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert _run_steps(purchase) == 1


def test_a_canceled_intent_still_applies_directly(client, new_purchase, api_client):
    # final: no read-back prompted
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_three_d_secure_method()
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.AWAITING_BUYER
    _ls("POST", f"/v1/payment_intents/{op.provider_reference}/cancel").raise_for_status()
    canceled = provider_object("payment_intents", op.provider_reference)

    assert _deliver(client, event_for(canceled, "payment_intent.canceled")) == EventResult.APPLIED

    op = _reload(op)
    assert (op.outcome, op.verification) == (Outcome.FAILED, Verification.WEBHOOK)
    assert not op.provider_calls.filter(purpose="reconcile").exists()


def test_a_stale_decline_against_a_persons_succeeded_is_superseded(
    client, new_purchase, pay, read_drill, person, localstripe
):
    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    read_drill(op.provider_reference, times=1)
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="succeeded",
        reason="provider dashboard shows paid",
        actor=person.username,
        acting_user=person,
    )
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    stale = _stale_decline(pi)

    assert _deliver(client, stale) == EventResult.IGNORED

    assert _stored(stale).result_reason == "superseded_by_readback"
    op = _reload(op)
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert _run_steps(purchase) == 1


def test_a_stale_decline_while_awaiting_the_buyer_who_then_passed_is_superseded(
    client, new_purchase, api_client, localstripe
):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_three_d_secure_method()
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.AWAITING_BUYER
    ref = op.provider_reference
    pi = provider_object("payment_intents", ref)
    _ls(
        "POST",
        f"/v1/payment_intents/{ref}/_authenticate",
        client_secret=pi["client_secret"],
        success="true",
    ).raise_for_status()
    assert provider_object("payment_intents", ref)["status"] == "succeeded"
    stale = _stale_decline(pi)

    assert _deliver(client, stale) == EventResult.IGNORED

    assert _stored(stale).result_reason == "superseded_by_readback"
    assert _reload(op).outcome == Outcome.SUCCEEDED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert _run_steps(purchase) == 1


def test_a_held_decline_is_retried_at_once_when_a_reconcile_settles_the_payment(
    client, new_purchase, pay, read_drill, localstripe
):
    from django.utils import timezone

    from recovery.relay import relay_drain

    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    read_drill(op.provider_reference, times=1)
    stale = _stale_decline(pi)
    assert _deliver(client, stale) == EventResult.HELD
    # its next retry is 2 s away; a reconcile settles the payment meanwhile
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED

    relay_drain()

    row = _stored(stale)
    assert (row.result, row.result_reason) == (EventResult.IGNORED, "superseded_by_readback")
    assert not OutboxMessage.objects.filter(
        category=OutboxCategory.PROCESS_EVENT,
        processed_at__isnull=True,
        available_at__lte=timezone.now(),
    ).exists()
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert _reload(op).outcome == Outcome.SUCCEEDED


def test_a_held_decline_retried_by_the_success_during_the_outage_leaves_the_success_standing(
    client, new_purchase, pay, read_drill, localstripe
):
    # The success settles the payment while reads still fail; held_events_retry_now retries
    # the stale decline at once: its conflict read fails too. Verity's state must stay the
    # provider's (succeeded); the event is only a person's to dismiss, never applied.
    from recovery.relay import relay_drain

    purchase, op, pi = _charged_answer_lost(new_purchase, pay)
    read_drill(op.provider_reference, times=1000)
    stale = _stale_decline(pi)
    assert _deliver(client, stale) == EventResult.HELD
    assert _deliver(client, event_for(pi, "payment_intent.succeeded")) == EventResult.APPLIED

    for _ in range(5):
        if not relay_drain():
            break

    row = _stored(stale)
    print("stale decline after the success, reads failing:", row.result, row.result_reason)
    assert row.result != EventResult.APPLIED
    op = _reload(op)
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert _run_steps(purchase) == 1


@pytest.mark.alone  # a child interpreter must charge within 30 s
def test_a_stale_decline_during_the_dispatch_waits_for_it_and_never_fails_the_charge(
    client, new_purchase, api_client, localstripe
):
    # The confirm is sent and the provider charges; the dispatching worker is still waiting
    # for the answer (then dies). A stale decline of that intent arrives meanwhile.
    import signal

    from tests.hanging_dispatch import start_hanging_dispatch
    from tests.waiting import wait_for

    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    child = start_hanging_dispatch(op.id)
    try:
        charged = wait_for(lambda: localstripe.succeeded_charges_for(purchase.id), timeout=30)
        assert _reload(op).outcome == Outcome.DISPATCHING
        stale = _stale_decline(charged[0])
        assert _deliver(client, stale) == EventResult.HELD
        assert _stored(stale).result_reason == "payment_not_settled"
        assert _reload(op).outcome == Outcome.DISPATCHING
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    # the dead dispatch is found (unknown); the held decline's retry reads the charge back
    wait_for(
        lambda: (
            services.operations_sweep_dead_dispatches()
            or _reload(op).outcome != Outcome.DISPATCHING
        ),
        timeout=10,
    )
    assert event_process(event_id=_stored(stale).pk) == EventResult.IGNORED
    assert _stored(stale).result_reason == "superseded_by_readback"
    op = _reload(op)
    assert op.outcome == Outcome.SUCCEEDED
    assert not OperationTransition.objects.filter(
        operation_id=op.pk, target=Outcome.FAILED
    ).exists()
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert _run_steps(purchase) == 1
