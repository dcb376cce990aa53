"""Processing: match, check, apply once through the one observation function.

Operations are real (payments services against localstripe); a lost answer comes from
the fault-drill HTTP client, so the provider really holds the object the event names.
"""

import copy

import pytest

from payments import services
from payments.enums import Grade, OperationKind, Outcome, PurchaseStatus, Verification
from payments.models import OperationTransition, PaymentOperation, Purchase
from recovery.models import OutboxCategory, OutboxMessage
from tests.localstripe import provider_object
from webhooks.models import EventResult, ProviderEvent
from webhooks.services import event_process

from .events import deliver_and_process, event_for, post

pytestmark = pytest.mark.django_db(transaction=True)


def reload(op) -> PaymentOperation:
    return PaymentOperation.objects.get(pk=op.pk)


def history(op) -> int:
    # the operation's own transitions: the purchase's status may move on meanwhile
    # (a relay worker of another test may run the downstream steps)
    return OperationTransition.objects.filter(operation_id=op.pk).count()


PAID_OR_LATER = (PurchaseStatus.PAID, PurchaseStatus.FULFILLING, PurchaseStatus.COMPLETED)


def stored(event) -> ProviderEvent:
    return ProviderEvent.objects.get(event_id=event["id"])


def outbox(category, **payload) -> int:
    return OutboxMessage.objects.filter(category=category, payload=payload).count()


def test_signed_success_settles_an_unknown_operation_once(client, new_purchase, pay):
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    assert op.outcome == Outcome.UNKNOWN  # the provider charged; the answer was lost
    pi = provider_object("payment_intents", op.provider_reference)
    assert pi["status"] == "succeeded"
    event = event_for(pi, "payment_intent.succeeded")

    assert deliver_and_process(client, event) == EventResult.APPLIED

    op = reload(op)
    assert (op.outcome, op.grade, op.verification) == (
        Outcome.SUCCEEDED,
        Grade.CONFIRMED,
        Verification.WEBHOOK,
    )
    assert Purchase.objects.get(pk=purchase.pk).status in PAID_OR_LATER
    row = stored(event)
    assert (row.operation_id, row.purchase_id) == (op.pk, purchase.pk)
    assert outbox(OutboxCategory.RUN_STEPS, purchase=purchase.pk) == 1
    assert outbox(OutboxCategory.OPERATION_SETTLED, operation=op.pk) == 1
    before = history(op)

    # redelivered 20 times, processed again, and a second event saying the same thing
    for _ in range(20):
        assert post(client, event).status_code == 200
    assert event_process(event_id=row.pk) == EventResult.APPLIED
    again = event_for(pi, "payment_intent.succeeded")
    assert deliver_and_process(client, again) == EventResult.IGNORED

    assert ProviderEvent.objects.filter(event_id__in=[event["id"], again["id"]]).count() == 2
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event['id']}").count() == 1
    assert history(op) == before
    assert outbox(OutboxCategory.RUN_STEPS, purchase=purchase.pk) == 1
    assert outbox(OutboxCategory.OPERATION_SETTLED, operation=op.pk) == 1


def test_signed_decline_settles_an_unknown_operation_failed(client, new_purchase, pay):
    purchase = new_purchase()
    op = pay(purchase, drop_response=True, method="pm_card_chargeCustomerFail")
    assert op.outcome == Outcome.UNKNOWN
    pi = provider_object("payment_intents", op.provider_reference)
    assert pi["last_payment_error"]

    event = event_for(pi, "payment_intent.payment_failed")
    assert deliver_and_process(client, event) == EventResult.APPLIED

    # a failed attempt is not the provider's last word: the read-back it prompted settled it
    op = reload(op)
    assert (op.outcome, op.verification, op.reason) == (
        Outcome.FAILED,
        Verification.PROVIDER,
        "card_declined",
    )
    assert stored(event).result_reason == "readback_agrees"
    assert op.provider_calls.filter(purpose="reconcile").count() == 1
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAYMENT_FAILED


def test_a_stale_decline_delivered_before_the_success_does_not_fail_a_paid_purchase(
    client, new_purchase, pay, localstripe
):
    # The provider charged (the answer was lost: unknown); an older signed event of a
    # failed attempt of the same PaymentIntent arrives first (deliveries are unordered).
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    assert op.outcome == Outcome.UNKNOWN
    pi = provider_object("payment_intents", op.provider_reference)
    assert pi["status"] == "succeeded"
    stale = {
        **pi,
        "status": "requires_payment_method",
        "last_payment_error": {"code": "card_declined", "message": "declined"},
    }
    event = event_for(stale, "payment_intent.payment_failed")
    event["created"] -= 60

    assert deliver_and_process(client, event) == EventResult.IGNORED

    op = reload(op)
    assert stored(event).result_reason == "superseded_by_readback"
    assert (op.outcome, op.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    assert Purchase.objects.get(pk=purchase.pk).status in PAID_OR_LATER
    assert not OperationTransition.objects.filter(
        operation_id=op.pk, target=Outcome.FAILED
    ).exists()
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert outbox(OutboxCategory.RUN_STEPS, purchase=purchase.pk) == 1
    # and the success itself, delivered after it, changes nothing more
    assert (
        deliver_and_process(client, event_for(pi, "payment_intent.succeeded"))
        == EventResult.IGNORED
    )
    assert outbox(OutboxCategory.RUN_STEPS, purchase=purchase.pk) == 1


def test_a_decline_waits_while_the_provider_cannot_be_read(client, new_purchase, pay, read_drill):
    purchase = new_purchase()
    op = pay(purchase, drop_response=True, method="pm_card_chargeCustomerFail")
    pi = provider_object("payment_intents", op.provider_reference)
    event = event_for(pi, "payment_intent.payment_failed")
    read_drill(op.provider_reference, times=1)

    assert deliver_and_process(client, event) == EventResult.HELD

    row = stored(event)
    assert (row.result_reason, row.operation_id) == ("payment_not_settled", op.pk)
    assert reload(op).outcome == Outcome.UNKNOWN  # absence of evidence is not failure
    assert (
        OutboxMessage.objects.filter(
            category=OutboxCategory.PROCESS_EVENT, dedupe_key=f"event:{event['id']}:held:1"
        ).count()
        == 1
    )
    # the provider answers again: the retry reads it back and the failure stands
    assert event_process(event_id=row.pk) == EventResult.APPLIED
    assert (reload(op).outcome, stored(event).result_reason) == (Outcome.FAILED, "readback_agrees")


@pytest.mark.parametrize(
    "field", ["amount", "currency", "purchase", "customer_reference", "account", "operation"]
)
def test_signed_event_that_does_not_match_is_quarantined_and_not_applied(
    client, new_purchase, pay, field
):
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    pi = provider_object("payment_intents", op.provider_reference)
    wrong = copy.deepcopy(pi)
    account = None
    if field == "amount":
        wrong["amount"] = pi["amount"] + 1
    elif field == "currency":
        wrong["currency"] = "eur"
    elif field == "purchase":
        wrong["metadata"]["purchase_id"] = "pur_someone_else"
    elif field == "customer_reference":
        wrong["metadata"]["customer_reference"] = "another-customer"
    elif field == "account":
        account = "acct_connected_elsewhere"
    elif field == "operation":
        wrong["metadata"]["operation_id"] = "op_someone_else"
    before = history(op)
    event = event_for(wrong, "payment_intent.succeeded", account=account)

    assert deliver_and_process(client, event) == EventResult.QUARANTINED

    assert stored(event).result_reason == f"mismatch:{field}"
    assert stored(event).operation_id == op.pk  # shown to operators next to the operation
    assert reload(op).outcome == Outcome.UNKNOWN
    assert history(op) == before
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAYMENT_UNKNOWN
    assert outbox(OutboxCategory.RUN_STEPS, purchase=purchase.pk) == 0
    # the genuine event still applies
    assert (
        deliver_and_process(client, event_for(pi, "payment_intent.succeeded"))
        == EventResult.APPLIED
    )


def test_currency_matches_case_insensitively(client, new_purchase, pay):
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    pi = provider_object("payment_intents", op.provider_reference)
    pi["currency"] = "USD"

    assert (
        deliver_and_process(client, event_for(pi, "payment_intent.succeeded"))
        == EventResult.APPLIED
    )
    assert reload(op).outcome == Outcome.SUCCEEDED


@pytest.mark.django_db(transaction=False)  # invisible to any relay worker (other settings)
@pytest.mark.parametrize(
    ("account", "expected"),
    [
        ("acct_platform", EventResult.APPLIED),  # the platform, named explicitly
        (None, EventResult.APPLIED),  # missing = the platform
        ("acct_connected", EventResult.QUARANTINED),
    ],
)
def test_account_is_the_configured_platform_when_missing(client, settings, account, expected):
    from tests.factories import PurchaseFactory

    settings.STRIPE_ACCOUNT = "acct_platform"
    purchase = PurchaseFactory(customer_reference="c-acct")
    op = PaymentOperation.objects.create(  # setup only
        purchase=purchase,
        kind=OperationKind.CHARGE,
        amount=1500,
        currency="usd",
        provider_reference="pi_acct",
        outcome=Outcome.UNKNOWN,
    )
    obj = {
        "id": "pi_acct",
        "object": "payment_intent",
        "status": "succeeded",
        "amount": 1500,
        "currency": "usd",
        "metadata": {
            "operation_id": op.pk,
            "purchase_id": purchase.pk,
            "customer_reference": "c-acct",
        },
    }

    assert (
        deliver_and_process(client, event_for(obj, "payment_intent.succeeded", account=account))
        == expected
    )
    assert reload(op).outcome == (
        Outcome.SUCCEEDED if expected == EventResult.APPLIED else Outcome.UNKNOWN
    )


@pytest.mark.parametrize("status", ["processing", "requires_action"])
def test_late_non_terminal_event_never_regresses_a_succeeded_operation(
    client, new_purchase, pay, status
):
    purchase = new_purchase()
    op = pay(purchase)
    assert op.outcome == Outcome.SUCCEEDED
    late = provider_object("payment_intents", op.provider_reference)
    late["status"] = status
    before = history(op)

    event = event_for(late, f"payment_intent.{status}")

    assert deliver_and_process(client, event) == EventResult.IGNORED
    assert stored(event).result_reason == "stale"
    op = reload(op)
    assert (op.outcome, op.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    assert history(op) == before


def test_conflicting_failure_after_success_is_settled_by_the_canonical_object(
    client, new_purchase, pay
):
    purchase = new_purchase()
    op = pay(purchase)
    stale = provider_object("payment_intents", op.provider_reference)
    stale["status"] = "requires_payment_method"
    stale["last_payment_error"] = {"code": "card_declined"}
    before = history(op)

    event = event_for(stale, "payment_intent.payment_failed")

    # localstripe's PaymentIntent says succeeded, as Verity does: the event is superseded
    assert deliver_and_process(client, event) == EventResult.IGNORED
    assert stored(event).result_reason == "superseded_by_readback"
    assert reload(op).outcome == Outcome.SUCCEEDED
    assert history(op) == before


def test_signed_event_overturns_a_manual_resolution_the_provider_contradicts(
    client, new_purchase, pay, read_drill
):
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    # someone resolved the unknown operation by hand as failed while the provider could
    # not be read (so it stands, acknowledged); the provider had charged
    read_drill(op.provider_reference)
    op = services.operation_resolve_manual(
        operation_id=op.pk,
        outcome=Outcome.FAILED,
        reason="buyer said the card was declined",
        actor="agent-7",
    )
    assert (op.outcome, op.grade) == (Outcome.FAILED, "acknowledged")
    pi = provider_object("payment_intents", op.provider_reference)

    event = event_for(pi, "payment_intent.succeeded")

    # The provider's signed record outranks the person.
    assert deliver_and_process(client, event) == EventResult.APPLIED
    op = reload(op)
    assert (op.outcome, op.grade, op.verification) == (Outcome.SUCCEEDED, "confirmed", "webhook")
    assert "manual_resolution_overturned" in [t.cause for t in op.transitions.all()]


def test_event_for_an_unknown_reference_is_held_then_applied_when_the_operation_appears(
    client, api_client
):
    from tests.factories import PurchaseFactory

    obj = {
        "id": "pi_arrives_early",
        "object": "payment_intent",
        "status": "succeeded",
        "amount": 1500,
        "currency": "usd",
        "latest_charge": "ch_early",
        "metadata": {
            "operation_id": "op_not_yet_committed",
            "purchase_id": "pur_not_yet_committed",
            "customer_reference": "early-bird",
        },
    }
    event = event_for(obj, "payment_intent.succeeded")

    assert deliver_and_process(client, event) == EventResult.HELD

    row = stored(event)
    assert (row.result, row.processed_at) == (EventResult.HELD, None)
    assert row.attempts >= 1  # (a relay worker may have tried too)
    retry = OutboxMessage.objects.get(dedupe_key=f"event:{event['id']}:held:1")
    assert retry.payload == {"event": row.pk}
    assert retry.available_at > row.received_at  # backoff lives in available_at

    # setup only: the operation row as the synchronous path commits it
    purchase = PurchaseFactory(
        id="pur_not_yet_committed", customer_reference="early-bird", api_client=api_client
    )
    op = PaymentOperation.objects.create(
        id="op_not_yet_committed",
        purchase=purchase,
        kind=OperationKind.CHARGE,
        amount=1500,
        currency="usd",
        provider_reference="pi_arrives_early",
        outcome=Outcome.UNKNOWN,
    )

    assert event_process(event_id=row.pk) == EventResult.APPLIED
    assert (reload(op).outcome, reload(op).verification) == (
        Outcome.SUCCEEDED,
        Verification.WEBHOOK,
    )


def test_event_never_matched_is_quarantined_unmatched_after_bounded_attempts(client):
    from webhooks.services import HELD_MAX_ATTEMPTS

    obj = {
        "id": "pi_nobody_knows",
        "object": "payment_intent",
        "status": "succeeded",
        "amount": 1500,
        "currency": "usd",
        "metadata": {},
    }
    event = event_for(obj, "payment_intent.succeeded")
    results = [deliver_and_process(client, event)]
    pk = stored(event).pk

    while results[-1] == EventResult.HELD:
        results.append(event_process(event_id=pk))

    # (a relay worker may take some of the attempts: the bound is on the event row)
    assert set(results[:-1]) == {EventResult.HELD} and len(results) <= HELD_MAX_ATTEMPTS
    assert results[-1] == EventResult.QUARANTINED
    row = stored(event)
    assert (row.result_reason, row.attempts) == ("unmatched", HELD_MAX_ATTEMPTS)
    assert (
        OutboxMessage.objects.filter(dedupe_key__startswith=f"event:{event['id']}:held:").count()
        == HELD_MAX_ATTEMPTS - 1
    )


def test_events_of_other_types_are_recorded_as_ignored(client):
    event = event_for(
        {"id": "cus_1", "object": "customer", "email": "x@example.com"}, "customer.created"
    )

    assert deliver_and_process(client, event) == EventResult.IGNORED

    assert stored(event).result_reason == "unhandled_type"
    assert "x@example.com" not in str(stored(event).payload)


def test_capture_event_settles_the_open_capture_not_the_authorization(
    client, new_purchase, pay, api_client, drill
):
    purchase = new_purchase()
    auth = pay(purchase, capture="manual")
    assert auth.outcome == Outcome.SUCCEEDED
    capture = services.capture_create(purchase_id=purchase.pk, api_client=api_client)
    drill(capture, "drop_response_after_send", step="capture")
    capture = services.operation_dispatch(operation_id=capture.pk)
    assert capture.outcome == Outcome.UNKNOWN
    pi = provider_object("payment_intents", auth.provider_reference)
    assert pi["status"] == "succeeded"

    event = event_for(pi, "payment_intent.succeeded")

    assert deliver_and_process(client, event) == EventResult.APPLIED

    assert (reload(capture).outcome, reload(capture).verification) == (
        Outcome.SUCCEEDED,
        Verification.WEBHOOK,
    )
    assert reload(auth).outcome == Outcome.SUCCEEDED
    assert stored(event).operation_id == capture.pk


def test_refund_event_settles_an_unknown_refund(client, new_purchase, pay, drill, localstripe):
    purchase = new_purchase()
    payment = pay(purchase)
    refund = services.refund_request(purchase_id=purchase.pk, compensation=True)
    drill(refund, "drop_response_after_send", step="refund")
    refund = services.operation_dispatch(operation_id=refund.pk)
    assert refund.outcome == Outcome.UNKNOWN
    [re] = localstripe.refunds_for(payment.provider_reference)
    wrong_amount = {**re, "amount": re["amount"] - 1}

    assert (
        deliver_and_process(client, event_for(wrong_amount, "refund.updated"))
        == EventResult.QUARANTINED
    )
    assert reload(refund).outcome == Outcome.UNKNOWN
    assert deliver_and_process(client, event_for(re, "refund.updated")) == EventResult.APPLIED

    assert (reload(refund).outcome, reload(refund).verification) == (
        Outcome.SUCCEEDED,
        Verification.WEBHOOK,
    )
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.REFUNDED


def test_charge_refunded_prompts_a_read_back_of_the_open_refund(client, new_purchase, pay, drill):
    from recovery.relay import handle_message

    purchase = new_purchase()
    payment = pay(purchase)
    refund = services.refund_request(purchase_id=purchase.pk, compensation=True)
    drill(refund, "drop_response_after_send", step="refund")
    refund = services.operation_dispatch(operation_id=refund.pk)
    assert refund.outcome == Outcome.UNKNOWN
    charge = {
        "id": payment.provider_charge or "ch_x",
        "object": "charge",
        "status": "succeeded",
        "amount": 1500,
        "amount_refunded": 1500,
        "currency": "usd",
        "payment_intent": payment.provider_reference,
        "metadata": {"purchase_id": purchase.pk},
    }
    event = event_for(charge, "charge.refunded")

    assert deliver_and_process(client, event) == EventResult.IGNORED  # settles nothing itself
    assert stored(event).result_reason == "charge_refunded_prompt:1"
    assert reload(payment).outcome == Outcome.SUCCEEDED
    prompt = OutboxMessage.objects.get(dedupe_key=f"reconcile:{refund.pk}:{event['id']}")
    assert prompt.category == OutboxCategory.RECONCILE

    handle_message(prompt)  # the relay's handler: a read-only read-back

    assert (reload(refund).outcome, reload(refund).verification) == (
        Outcome.SUCCEEDED,
        Verification.PROVIDER,
    )


def test_webhook_first_then_the_synchronous_answer_changes_nothing(client, new_purchase, pay):
    from payments.enums import Rail
    from payments.services import provider_for_rail

    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    pi = provider_object("payment_intents", op.provider_reference)
    assert (
        deliver_and_process(client, event_for(pi, "payment_intent.succeeded"))
        == EventResult.APPLIED
    )
    before = history(op)

    # the synchronous path's phase 3 arriving late, through the same one function
    answer = provider_for_rail(Rail.STRIPE).retrieve_payment_intent(op.provider_reference).object
    late = services.operation_apply_observation(
        operation_id=op.pk, obj=answer, source=Verification.PROVIDER, cause="confirm_ok"
    )

    assert late == services.ApplyResult.NO_CHANGE
    assert history(op) == before
    assert reload(op).verification == Verification.WEBHOOK
    assert outbox(OutboxCategory.RUN_STEPS, purchase=purchase.pk) == 1


def test_same_event_delivered_and_processed_concurrently_applies_once(
    live_server, new_purchase, pay
):
    import json
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import requests
    from django.db import connection

    from .events import sign

    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    event = event_for(
        provider_object("payment_intents", op.provider_reference), "payment_intent.succeeded"
    )
    body = json.dumps(event).encode()
    barrier = threading.Barrier(20)

    def deliver_then_process(_):
        barrier.wait(10)
        r = requests.post(
            f"{live_server.url}/webhooks/stripe/",
            data=body,
            timeout=15,
            headers={"Stripe-Signature": sign(body), "Content-Type": "application/json"},
        )
        try:
            return r.status_code, event_process(
                event_id=ProviderEvent.objects.get(event_id=event["id"]).pk
            )
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=20) as pool:
        outcomes = list(pool.map(deliver_then_process, range(20)))

    assert {status for status, _ in outcomes} == {200}
    assert {result for _, result in outcomes} == {EventResult.APPLIED}
    assert ProviderEvent.objects.filter(event_id=event["id"]).count() == 1
    assert OutboxMessage.objects.filter(dedupe_key=f"event:{event['id']}").count() == 1
    assert (
        OperationTransition.objects.filter(operation_id=op.pk, target=Outcome.SUCCEEDED).count()
        == 1
    )
    assert outbox(OutboxCategory.RUN_STEPS, purchase=purchase.pk) == 1
    assert outbox(OutboxCategory.OPERATION_SETTLED, operation=op.pk) == 1
