"""A two-step payment (create, then confirm: the provider does not dedupe keys) whose
create answer was lost after the provider made the PaymentIntent. Verity does not know
its id, yet the PaymentIntent holds the card and waits for a confirm: anyone holding the
secret key could complete it (a charge with no order), and a new attempt under a new key
would leave two payable PaymentIntents for one purchase.

The rule, judged on localstripe's record: every PaymentIntent made for an operation is
either the one Verity follows (adopted: its id stored, then confirmed) or cancelled before
another payment of the purchase is created; never one left payable beside Verity's record.
Faults only through the fault-drill HTTP client; counted at localstripe and in the
database.
"""

import sys
from pathlib import Path

import pytest

from payments import services
from payments.enums import CallStep, Outcome, PurchaseStatus
from payments.models import ProviderCall
from payments.providers.stripe import DrillMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

pytestmark = pytest.mark.django_db(transaction=True)

# A PaymentIntent in these statuses can still be completed by whoever holds the secret key.
PAYABLE = ("requires_payment_method", "requires_confirmation", "requires_action", "processing")


def _start(purchase, api_client, retry_of=None):
    return services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        retry_of=retry_of,
    )


def _intents_of(localstripe, op) -> list[dict]:
    return [
        pi
        for pi in localstripe.payment_intents_for(op.purchase_id)
        if (pi.get("metadata") or {}).get("operation_id") == op.id
    ]


def _no_payable_intent_beside_the_record() -> None:
    """The soak's rule, judged on localstripe's raw record (this test's operations)."""
    from bench.invariants import INVARIANTS, Facts, Report

    [rule] = [i for i in INVARIANTS if i.rule == "no-payable-intent-beside-the-record"]
    report = Report()
    report.invariant = rule.rule
    rule.fn(Facts(live=False), report)
    assert report.violations == [], report.rows


def _charges_of(localstripe, purchase_id: str) -> list[dict]:
    intents = {pi["id"] for pi in localstripe.payment_intents_for(purchase_id)}
    return [
        ch
        for ch in localstripe.list("charges")
        if ch.get("payment_intent") in intents and ch.get("status") == "succeeded"
    ]


@pytest.mark.parametrize(
    "mode", [DrillMode.DROP_RESPONSE_AFTER_SEND, DrillMode.RESET_AFTER_WRITE, DrillMode.HTTP_500]
)
def test_a_payment_intent_whose_create_answer_was_lost_is_adopted_and_paid_once(
    mode, new_purchase, api_client, localstripe, drill
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, mode, step=CallStep.CREATE)

    op = services.operation_dispatch(operation_id=op.id)

    _no_payable_intent_beside_the_record()
    [pi] = _intents_of(localstripe, op)
    assert pi["status"] == "succeeded"
    assert (op.outcome, op.provider_reference) == (Outcome.SUCCEEDED, pi["id"])
    assert op.purchase.status == PurchaseStatus.PAID
    assert len(_charges_of(localstripe, purchase.id)) == 1
    # created once (its answer lost), confirmed once: nothing created again
    steps = list(
        ProviderCall.objects.filter(operation=op, purpose="dispatch")
        .order_by("started_at")
        .values_list("step", flat=True)
    )
    assert steps == [CallStep.CREATE, CallStep.CONFIRM]
    assert len(localstripe.payment_intents_for(purchase.id)) == 1


def test_an_unfound_payment_intent_blocks_a_new_payment_until_it_is_cancelled(
    new_purchase, api_client, localstripe, drill, read_drill, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the search for it right after cannot read the provider

    op = services.operation_dispatch(operation_id=op.id)

    # the PaymentIntent exists at the provider, payable; Verity cannot say it does not
    [orphan] = _intents_of(localstripe, op)
    assert orphan["status"] in PAYABLE
    assert op.outcome != Outcome.FAILED
    # so no second payment of the purchase may be created beside it
    with pytest.raises(services.DomainError) as refused:
        _start(purchase, api_client, op.id)
    assert refused.value.code == "payment_unresolved"
    assert len(localstripe.payment_intents_for(purchase.id)) == 1

    # the read-back finds it, cancels it at the provider and settles the payment failed
    op = services.operation_reconcile(operation_id=op.id)
    assert (op.outcome, op.provider_reference) == (Outcome.FAILED, orphan["id"])
    [orphan] = _intents_of(localstripe, op)
    assert orphan["status"] == "canceled"

    # the buyer pays again: one charge, and no PaymentIntent of the purchase left payable
    again = services.operation_dispatch(operation_id=_start(purchase, api_client, op.id).id)
    assert again.outcome == Outcome.SUCCEEDED
    intents = localstripe.payment_intents_for(purchase.id)
    assert sorted(pi["status"] for pi in intents) == ["canceled", "succeeded"]
    assert len(_charges_of(localstripe, purchase.id)) == 1
    _no_payable_intent_beside_the_record()


def test_a_create_that_made_nothing_fails_once_a_complete_read_finds_nothing(
    new_purchase, api_client, localstripe, drill, settings
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    # an answer that tells nothing, for a create that never ran at the provider
    drill(op, DrillMode.HTTP_409, step=CallStep.CREATE)

    op = services.operation_dispatch(operation_id=op.id)
    # inside the provider's in-flight window a create may still run: not failed yet
    assert op.outcome == Outcome.UNKNOWN
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    op = services.operation_reconcile(operation_id=op.id)

    assert (op.outcome, op.reason) == (Outcome.FAILED, "not_confirmed")
    assert localstripe.payment_intents_for(purchase.id) == []
    again = services.operation_dispatch(operation_id=_start(purchase, api_client, op.id).id)
    assert again.outcome == Outcome.SUCCEEDED
    assert len(_charges_of(localstripe, purchase.id)) == 1


@pytest.mark.parametrize("made", [True, False], ids=["intent-made", "nothing-made"])
@pytest.mark.parametrize("word", ["succeeded", "failed"])
def test_a_persons_word_on_it_is_judged_by_the_provider_record(
    made, word, new_purchase, api_client, localstripe, drill, read_drill, people, settings
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    # the create's answer lost (the provider made the intent) or a 409 (it made none)
    mode = DrillMode.DROP_RESPONSE_AFTER_SEND if made else DrillMode.HTTP_409
    drill(op, mode, step=CallStep.CREATE)
    read_drill("*")  # the dispatcher's search cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    # a person settles it while the provider cannot be read: their word stands for now
    read_drill("*")
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome=word,
        reason="the buyer's bank statement",
        actor="resolver",
        acting_user=people.resolver,
    )
    assert (op.outcome, op.grade) == (word, "acknowledged")

    # the read-back: Verity never sent a confirm, so no money moved whatever was said
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    op = services.operation_reconcile(operation_id=op.id)

    assert (op.outcome, op.grade) == (Outcome.FAILED, "confirmed")
    intents = _intents_of(localstripe, op)
    assert [pi["status"] for pi in intents] == (["canceled"] if made else [])
    assert _charges_of(localstripe, purchase.id) == []
    _no_payable_intent_beside_the_record()


def test_a_persons_failed_cancels_the_found_intent_before_another_payment(
    new_purchase, api_client, localstripe, drill, read_drill, people
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the dispatcher's search cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN

    # a person settles it failed while the provider can be read
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="the buyer gave up",
        actor="resolver",
        acting_user=people.resolver,
    )

    # the intent the read found is cancelled before the purchase is free for another
    assert op.outcome == Outcome.FAILED
    [orphan] = _intents_of(localstripe, op)
    assert orphan["status"] == "canceled"
    again = services.operation_dispatch(operation_id=_start(purchase, api_client, op.id).id)
    assert again.outcome == Outcome.SUCCEEDED
    assert len(_charges_of(localstripe, purchase.id)) == 1
    _no_payable_intent_beside_the_record()
