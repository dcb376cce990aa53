"""A one-call payment whose answers were lost, settled by a person while the provider could
not be read. The follow-up read-back finds its PaymentIntent by `operation_id` metadata
(Verity never heard the id) and the provider agrees with the person: the word is
confirmed, and the PaymentIntent is the payment's from then on, kept by its id.

- `succeeded` (an authorization): the id is what says the money moved at the provider, and
  what the capture sends; without it the payment reads "succeeded, confirmed by the
  provider" with no PaymentIntent behind it.
- `failed` (a declined card): the PaymentIntent stays `requires_payment_method`, payable
  with the secret key (a charge with no order) unless it is cancelled.

Judged on localstripe's raw record and the soak's money rules."""

import pytest
import requests
from django.conf import settings

from payments import services
from payments.enums import CallStep, Grade, OperationKind, Outcome
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode
from recovery.relay import relay_drain_once

pytestmark = pytest.mark.django_db(transaction=True)

PAYABLE = ("requires_payment_method", "requires_confirmation", "requires_action")


def _drain() -> None:
    while relay_drain_once():
        pass


def _money_rules_hold() -> None:
    from bench.invariants import INVARIANTS, Facts, Report

    report = Report()
    facts = Facts(live=False)
    for rule in INVARIANTS:
        if rule.rule in (
            "success-means-charged",
            "provider-confirmed-success-stands",
            "no-payable-intent-beside-the-record",
        ):
            report.invariant = rule.rule
            rule.fn(facts, report)
    assert report.violations == [], report.rows


def _resolved_unread(purchase, api_client, drill, read_drill, *, method, capture, outcome):
    """A one-call payment sent, both its answers lost after the provider ran, then settled
    `outcome` by a person while the provider could not be read."""
    op = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method=method,
        capture_method=capture,
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=2)
    read_drill("*", times=50)
    op = services.operation_dispatch(operation_id=op.id)
    assert (op.outcome, op.provider_reference) == (Outcome.UNKNOWN, "")
    op = services.operation_resolve_manual(
        operation_id=op.id, outcome=outcome, reason="the buyer says so", actor="support:alice"
    )
    assert (op.outcome, op.grade) == (outcome, Grade.ACKNOWLEDGED)
    read_drill("*", times=0)  # the provider can be read again
    return op


def test_persons_succeeded_confirmed_by_metadata_keeps_the_intent_id(
    new_purchase, api_client, one_call, drill, read_drill
):
    purchase = new_purchase()
    op = _resolved_unread(
        purchase,
        api_client,
        drill,
        read_drill,
        method="pm_card_visa",
        capture="manual",
        outcome=Outcome.SUCCEEDED,
    )
    [intent] = one_call.payment_intents_for(purchase.id)
    assert intent["status"] == "requires_capture"

    op = services.operation_reconcile(operation_id=op.id)  # the follow-up read-back
    assert (op.kind, op.outcome, op.grade) == (
        OperationKind.AUTHORIZE,
        Outcome.SUCCEEDED,
        Grade.CONFIRMED,
    )
    assert PaymentOperation.objects.get(id=op.id).provider_reference == intent["id"]
    _drain()
    _money_rules_hold()

    capture = services.operation_dispatch(
        operation_id=services.capture_create(purchase_id=purchase.id, api_client=api_client).id
    )
    assert capture.outcome == Outcome.SUCCEEDED
    assert [pi["status"] for pi in one_call.payment_intents_for(purchase.id)] == ["succeeded"]


def test_persons_failed_confirmed_by_metadata_cancels_the_declined_intent(
    new_purchase, api_client, one_call, drill, read_drill
):
    purchase = new_purchase()
    op = _resolved_unread(
        purchase,
        api_client,
        drill,
        read_drill,
        method="pm_card_chargeCustomerFail",
        capture="automatic",
        outcome=Outcome.FAILED,
    )
    [intent] = one_call.payment_intents_for(purchase.id)
    assert intent["status"] == "requires_payment_method"

    op = services.operation_reconcile(operation_id=op.id)  # the follow-up read-back
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    _drain()

    intents = one_call.payment_intents_for(purchase.id)
    assert [pi["id"] for pi in intents] == [intent["id"]]
    assert [pi["status"] for pi in intents if pi["status"] in PAYABLE] == []
    assert PaymentOperation.objects.get(id=op.id).provider_reference == intent["id"]
    _money_rules_hold()


def _three_d_secure_method(localstripe) -> str:
    r = requests.post(
        f"{localstripe.base}/v1/payment_methods",
        data={
            "type": "card",
            "card[number]": "4000002760003184",
            "card[exp_month]": "12",
            "card[exp_year]": "2030",
            "card[cvc]": "123",
        },
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["id"]


def test_persons_failed_on_an_intent_read_by_metadata_cancels_it_first(
    new_purchase, api_client, one_call, drill, read_drill
):
    """The same payment waiting for the buyer's 3-D Secure (`requires_action`), its answers
    lost while the provider could not be read; the person decides once it can be: the read
    finds the intent by metadata, and a `failed` cancels it at the provider first, as it
    does for a payment whose id Verity holds."""
    purchase = new_purchase(price=1500)
    op = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method=_three_d_secure_method(one_call),
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=2)
    read_drill("*", times=50)
    op = services.operation_dispatch(operation_id=op.id)
    assert (op.outcome, op.provider_reference) == (Outcome.UNKNOWN, "")
    read_drill("*", times=0)
    [intent] = one_call.payment_intents_for(purchase.id)
    assert intent["status"] == "requires_action"

    op = services.operation_resolve_manual(
        operation_id=op.id, outcome=Outcome.FAILED, reason="abandoned", actor="support:alice"
    )
    assert op.outcome == Outcome.FAILED
    assert [pi["status"] for pi in one_call.payment_intents_for(purchase.id)] == ["canceled"]
    assert PaymentOperation.objects.get(id=op.id).provider_reference == intent["id"]
