"""The provider's record outranks a person for
every operation kind; a person's word is never a licence to charge again.

Counted at localstripe (PaymentIntents, charges) and in the database (operations,
history, provider calls); faults come from the fault-drill HTTP client only.
"""

import pytest
import requests
from django.conf import settings

from payments import services
from payments.enums import (
    OVERTURN_CAUSE,
    CallPurpose,
    CallStep,
    Grade,
    Outcome,
)
from payments.models import OperationTransition, PaymentOperation, ProviderCall
from payments.providers.stripe import DrillMode
from recovery.halts import halt_set
from support.models import Resolution
from tests.localstripe import provider_object
from tests.payments.test_provider_outranks_people import _awaiting_buyer

pytestmark = pytest.mark.django_db(transaction=True)


def _reload(op):
    return PaymentOperation.objects.get(pk=op.pk)


def _resolve(op, outcome, resolver, reason="the person's word"):
    return services.operation_resolve_manual(
        operation_id=op.id,
        outcome=outcome,
        reason=reason,
        actor="resolver-r3",
        acting_user=resolver,
    )


def _unknown_capture(new_purchase, api_client, drill):
    """An authorization that succeeded and a capture the provider never applied (its
    answer was a 409 before anything was applied): `unknown` at Verity."""
    purchase = new_purchase()
    auth = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        capture_method="manual",
    )
    auth = services.operation_dispatch(operation_id=auth.id)
    assert auth.outcome == Outcome.SUCCEEDED
    capture = services.capture_create(purchase_id=purchase.id, api_client=api_client)
    drill(capture, DrillMode.HTTP_409, step="capture")
    capture = services.operation_dispatch(operation_id=capture.id)
    assert capture.outcome == Outcome.UNKNOWN, capture.outcome
    assert (
        provider_object("payment_intents", auth.provider_reference)["status"] == "requires_capture"
    )
    return purchase, auth, capture


# -- 5. every kind: a record that shows no money moved refuses "succeeded" -------------------


def test_capture_succeeded_is_refused_while_the_provider_shows_requires_capture(
    new_purchase, api_client, drill, resolver, localstripe
):
    purchase, auth, capture = _unknown_capture(new_purchase, api_client, drill)

    with pytest.raises(services.DomainError) as err:
        _resolve(capture, "succeeded", resolver)

    assert err.value.code == "provider_contradicts"
    assert "requires_capture" in err.value.message
    assert _reload(capture).outcome == Outcome.UNKNOWN
    assert Resolution.objects.filter(operation_id=capture.id).count() == 0
    # Nothing was captured at the provider.
    assert (
        provider_object("payment_intents", auth.provider_reference)["status"] == "requires_capture"
    )


def test_capture_succeeded_accepted_unread_is_overturned_by_a_later_read_back(
    new_purchase, api_client, drill, read_drill, resolver, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase, auth, capture = _unknown_capture(new_purchase, api_client, drill)
    read_drill("*")  # the read-back before the resolution fails
    capture = _resolve(capture, "succeeded", resolver)
    assert (capture.outcome, capture.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)

    # the scheduled read-back: the provider still shows the authorization uncaptured
    services.operation_reconcile(operation_id=capture.id, actor="reconciler")

    capture = _reload(capture)
    assert (capture.outcome, capture.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    row = OperationTransition.objects.get(operation=capture, cause=OVERTURN_CAUSE)
    assert (row.source, row.target) == ("succeeded", "failed")
    assert row.evidence["overturned"]["outcome"] == "succeeded"
    assert (
        provider_object("payment_intents", auth.provider_reference)["status"] == "requires_capture"
    )


def test_charge_succeeded_accepted_unread_then_read_as_requires_action_is_overturned(
    new_purchase, api_client, read_drill, resolver, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase, op = _awaiting_buyer(new_purchase, api_client)
    read_drill("*")
    op = _resolve(op, "succeeded", resolver, reason="buyer says they authenticated")
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    assert provider_object("payment_intents", op.provider_reference)["status"] == "requires_action"

    services.operation_reconcile(operation_id=op.id, actor="reconciler")

    # the provider's record (cancelled, so the buyer cannot complete it later) outranks it
    op = _reload(op)
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    assert provider_object("payment_intents", op.provider_reference)["status"] == "canceled"
    assert OperationTransition.objects.filter(operation=op, cause=OVERTURN_CAUSE).exists()
    assert localstripe.succeeded_charges_for(purchase.id) == []


# -- 10. a person's failed while processing; cooldown; retry of an unverified failed ----------


def _declining_sepa_method() -> str:
    """A SEPA debit the bank will refuse: the provider holds its PaymentIntent
    `processing` (localstripe: half a second) before it fails."""
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_methods",
        data={
            "type": "sepa_debit",
            "sepa_debit[iban]": "DE62370400440532013001",
            "billing_details[name]": "Ada",
            "billing_details[email]": "ada@example.com",
        },
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["id"]


# The provider holds the payment `processing` for half a second (localstripe's SEPA window):
# the person's word must land inside it, which the parallel run's load can outlast.
@pytest.mark.alone
def test_a_persons_failed_is_refused_while_the_provider_is_processing(
    new_purchase, api_client, drill, resolver, localstripe
):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_declining_sepa_method()
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN

    # within the provider's processing window a person says "failed"
    with pytest.raises(services.DomainError) as err:
        _resolve(op, "failed", resolver, reason="bank says no")

    assert err.value.code == "provider_processing" and err.value.status == 409
    assert err.value.extra["provider"]["status"] == "processing"
    op = _reload(op)
    assert op.outcome != Outcome.FAILED and op.grade != Grade.ACKNOWLEDGED
    assert Resolution.objects.filter(operation_id=op.id).count() == 0


def test_on_demand_reconcile_cooldown_applies_to_an_operation_a_person_settled(
    new_purchase, api_client, drill, read_drill, resolver, localstripe, settings
):
    settings.RECONCILE_ON_DEMAND_COOLDOWN_SECONDS = 60
    from django.core.cache import cache

    purchase, auth, capture = _unknown_capture(new_purchase, api_client, drill)
    read_drill("*")
    capture = _resolve(capture, "succeeded", resolver)
    cache.delete(f"reconcile-on-demand:{capture.id}")
    read_drill("*", times=100)  # keep it unreadable: the person's word stays
    reads = ProviderCall.objects.filter(operation=capture, purpose=CallPurpose.RECONCILE)
    before = reads.count()
    waits = [
        services.operation_reconcile_on_demand(operation_id=capture.id, actor="api")
        for _ in range(5)
    ]
    assert waits[0] == 0 and all(w > 0 for w in waits[1:]), waits
    assert reads.count() == before + 1


def test_retry_of_a_persons_failed_waits_until_the_provider_is_read(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):
    # given a charge the provider took whose answer was lost
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    # and a person's "failed" accepted while the provider could not be read
    read_drill("*")
    op = _resolve(op, "failed", resolver, reason="buyer says declined")
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.ACKNOWLEDGED)

    # when the agent retries it while the provider is still unreadable
    read_drill("*", times=100)
    with pytest.raises(services.DomainError) as err:
        retry = services.payment_create(
            purchase_id=purchase.id,
            api_client=api_client,
            payment_method="pm_card_mastercard",
            retry_of=op.id,
        )
        services.operation_dispatch(operation_id=retry.id)

    # then no second charge: refused until the original is read back
    assert err.value.code == "original_unverified" and err.value.status == 503
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1


# -- every write to the provider honours halts: the cancel before a person's failed ----------


def test_a_persons_failed_does_not_cancel_at_the_provider_while_checkout_is_halted(
    new_purchase, api_client, resolver, localstripe
):
    purchase, op = _awaiting_buyer(new_purchase, api_client)
    halt_set(name="checkout", reason="incident", actor="op1")

    with pytest.raises(services.DomainError) as err:
        _resolve(op, "failed", resolver, reason="buyer abandoned 3-D Secure")

    assert err.value.code == "workflow_halted" and err.value.status == 503
    assert provider_object("payment_intents", op.provider_reference)["status"] == "requires_action"
    assert not ProviderCall.objects.filter(operation=op, step=CallStep.CANCEL).exists()
    assert _reload(op).outcome == Outcome.AWAITING_BUYER


def test_the_unapplied_cancel_does_not_write_while_checkout_is_halted(
    new_purchase, api_client, drill, resolver, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.HTTP_409)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    halt_set(name="checkout", reason="incident", actor="op1")

    with pytest.raises(services.DomainError) as err:
        services.operation_cancel_unapplied(
            operation_id=op.id, reason="never applied", actor="resolver-r3"
        )

    assert err.value.code == "workflow_halted"
    assert (
        provider_object("payment_intents", op.provider_reference)["status"]
        == "requires_confirmation"
    )
    assert not ProviderCall.objects.filter(operation=op, step=CallStep.CANCEL).exists()
