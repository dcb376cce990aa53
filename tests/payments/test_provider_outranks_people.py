"""The provider's record outranks a person's resolution.

Counted at localstripe (PaymentIntents, refunds) and in the database (operations,
holds, history, queues); faults come from the fault-drill HTTP client only.
"""

import pytest
import requests
from django.conf import settings

from payments import services
from payments.enums import OVERTURN_CAUSE, Grade, HoldState, Outcome, PurchaseStatus, Verification
from payments.models import Hold, OperationTransition, PaymentOperation, ProviderCall, Purchase
from payments.providers.stripe import DrillMode
from recovery.models import OutboxCategory, OutboxMessage
from support.models import AuditEntry, Resolution
from tests.localstripe import provider_object

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_provider_outranks"


def _unknown_charge(new_purchase, api_client, drill):
    """A charge the provider took whose answer was lost: `unknown` at Verity."""
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    return purchase, op


def _reload(op):
    return PaymentOperation.objects.get(pk=op.pk)


def _status(purchase):
    return Purchase.objects.get(pk=purchase.pk).status


def _hold(op):
    return Hold.objects.get(operation_id=op.pk).state


def test_manual_failed_the_provider_contradicts_is_refused_and_its_record_applied(
    new_purchase, api_client, drill, resolver, localstripe
):
    purchase, op = _unknown_charge(new_purchase, api_client, drill)

    with pytest.raises(services.DomainError) as err:
        services.operation_resolve_manual(
            operation_id=op.id,
            outcome="failed",
            reason="buyer says declined",
            actor="resolver-1",
            acting_user=resolver,
        )

    assert err.value.code == "provider_contradicts" and err.value.status == 409
    assert "'succeeded'" in err.value.message  # names what the provider shows
    assert err.value.extra["provider"]["status"] == "succeeded"
    op = _reload(op)
    assert (op.outcome, op.grade, op.verification) == ("succeeded", "confirmed", "provider")
    assert _status(purchase) == PurchaseStatus.PAID and _hold(op) == HoldState.CONSUMED
    assert Resolution.objects.filter(operation_id=op.id).count() == 0
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1


def test_unreachable_provider_accepts_acknowledged_and_a_signed_event_overturns_it(
    new_purchase, api_client, drill, read_drill, resolver, deliver, localstripe
):
    purchase, op = _unknown_charge(new_purchase, api_client, drill)
    read_drill(op.provider_reference)  # the read-back before the resolution fails
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="buyer says declined",
        actor="resolver-1",
        acting_user=resolver,
    )
    assert (op.outcome, op.grade, op.verification) == ("failed", "acknowledged", "manual")
    assert _status(purchase) == PurchaseStatus.PAYMENT_FAILED
    assert _hold(op) == HoldState.RELEASED

    # when the provider's own signed payment_intent.succeeded arrives
    pi = provider_object("payment_intents", op.provider_reference)
    assert deliver(pi, "payment_intent.succeeded") == "applied"

    # then the provider's outcome stands, graded confirmed, and the overturn is recorded
    op = _reload(op)
    assert (op.outcome, op.grade, op.verification) == ("succeeded", "confirmed", "webhook")
    row = OperationTransition.objects.get(operation=op, cause=OVERTURN_CAUSE)
    assert (row.source, row.target) == ("failed", "succeeded")
    overturned = row.evidence["overturned"]
    assert overturned["actor"] == "resolver-1" and overturned["outcome"] == "failed"
    assert overturned["reason"] == "buyer says declined" and overturned["at"]
    assert row.evidence["provider"]["id"] == op.provider_reference
    # holds and the purchase follow; fulfilment is queued
    assert _hold(op) == HoldState.CONSUMED
    assert _status(purchase) == PurchaseStatus.PAID
    assert OutboxMessage.objects.filter(
        category=OutboxCategory.RUN_STEPS,
        payload={"purchase": purchase.id},
        processed_at__isnull=True,
    ).exists()
    # a console queue item, and the metric the alert reads
    from recovery.metrics import DatabaseCollector
    from support.selectors import queue_items

    assert [i.ref for i in queue_items("overturned")] == [op.id]
    metrics = {m.name: m for m in DatabaseCollector().collect()}
    assert metrics["verity_manual_resolutions_overturned"].samples[0].value == 1

    # and a deliberate retry of the "failed" payment is refused: it did succeed
    with pytest.raises(services.DomainError) as err:
        services.payment_create(
            purchase_id=purchase.id,
            api_client=api_client,
            payment_method="pm_card_visa",
            retry_of=op.id,
        )
    assert err.value.code == "original_succeeded"
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    assert len(localstripe.payment_intents_for(purchase.id)) == 1


def test_retry_of_reads_the_original_back_first_and_refuses_if_it_succeeded(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):
    purchase, op = _unknown_charge(new_purchase, api_client, drill)
    read_drill(op.provider_reference)
    services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="no charge",
        actor="resolver-1",
        acting_user=resolver,
    )

    # the provider is reachable again; nobody has read it back yet
    with pytest.raises(services.DomainError) as err:
        services.payment_create(
            purchase_id=purchase.id,
            api_client=api_client,
            payment_method="pm_card_visa",
            retry_of=op.id,
        )

    assert err.value.code == "original_succeeded" and err.value.status == 409
    op = _reload(op)
    assert (op.outcome, op.grade, op.verification) == ("succeeded", "confirmed", "provider")
    assert OperationTransition.objects.filter(operation=op, cause=OVERTURN_CAUSE).count() == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert _status(purchase) == PurchaseStatus.PAID


def test_retry_of_through_the_api_answers_original_succeeded(
    new_purchase, api_client, client_and_key, drill, read_drill, resolver, client, localstripe
):
    purchase, op = _unknown_charge(new_purchase, api_client, drill)
    read_drill(op.provider_reference)
    services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="no charge",
        actor="resolver-1",
        acting_user=resolver,
    )

    r = client.post(
        f"/api/v1/purchases/{purchase.id}/payments",
        data={"payment_method": "pm_card_visa", "retry_of": op.id},
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="retry-1",
        HTTP_AUTHORIZATION=f"Api-Key {client_and_key[1]}",
    )

    assert r.status_code == 409 and r.json()["code"] == "original_succeeded", r.content
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1


def _charged_twice(new_purchase, api_client, drill, read_drill, resolver, localstripe):
    """A charge whose answer was lost, wrongly resolved `failed`, then a retry that charged
    again: two charges at the provider.

    Verity's own paths no longer lead here on Stripe: a retry of a person's `failed` waits
    until the provider is read, and a readable provider refuses the wrong word.
    The duplicate handling stays as the defence behind those guards (x402 still produces
    duplicates for real: tests/x402/test_duplicate_compensation_rail.py), so the given is
    built explicitly: while the retry is made, the first failure is recorded as if the
    provider had confirmed it (the one row write below); everything else is the real path."""
    purchase, first = _unknown_charge(new_purchase, api_client, drill)
    read_drill(first.provider_reference, times=1)
    services.operation_resolve_manual(
        operation_id=first.id,
        outcome="failed",
        reason="no charge",
        actor="resolver-1",
        acting_user=resolver,
    )
    wrong_word = PaymentOperation.objects.filter(id=first.id)
    grade = wrong_word.values_list("grade", "verification").get()
    wrong_word.update(grade=Grade.CONFIRMED, verification=Verification.PROVIDER)
    retry = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        retry_of=first.id,
    )
    wrong_word.update(grade=grade[0], verification=grade[1])
    retry = services.operation_dispatch(operation_id=retry.id)
    assert retry.outcome == Outcome.SUCCEEDED and _status(purchase) == PurchaseStatus.PAID
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 2  # charged twice
    return purchase, first, retry


def test_a_second_confirmed_charge_is_a_duplicate_refunded_automatically(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )

    # when the first charge is read back
    services.operation_reconcile(operation_id=first.id)

    # then it is the duplicate (confirmed later), and a linked refund returns it
    first = _reload(first)
    assert (first.outcome, first.grade, first.is_duplicate) == ("succeeded", "confirmed", True)
    assert not _reload(retry).is_duplicate
    refund = PaymentOperation.objects.get(parent=first, kind="refund")
    assert refund.is_compensation and refund.amount == first.amount
    assert refund.idempotency_key not in (first.idempotency_key, retry.idempotency_key)
    assert OutboxMessage.objects.filter(
        category=OutboxCategory.DISPATCH, payload={"operation": refund.id}
    ).exists()
    refund = services.operation_dispatch(operation_id=refund.id)
    assert (refund.outcome, refund.grade) == ("succeeded", Grade.CONFIRMED)
    refunds = localstripe.refunds_for(first.provider_reference)
    assert [(r["amount"], r["status"]) for r in refunds] == [(first.amount, "succeeded")]
    assert localstripe.refunds_for(retry.provider_reference) == []
    # the purchase stays paid by the retry; the duplicate is in its own queue
    assert _status(purchase) == PurchaseStatus.PAID
    from support.selectors import queue_items

    items = queue_items("duplicates")
    assert [i.ref for i in items] == [first.id] and "succeeded" in items[0].summary
    # and the purchase's refundable amount is the retry's only
    with pytest.raises(services.DomainError) as err:
        services.refund_request(
            purchase_id=purchase.id, amount=retry.amount + 1, api_client=api_client
        )
    assert err.value.code == "refund_exceeds_refundable"


def _three_d_secure_method() -> str:
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_methods",
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


def _awaiting_buyer(new_purchase, api_client):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_three_d_secure_method()
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.AWAITING_BUYER
    return purchase, op


def _authenticate(pi_id: str) -> int:
    pi = provider_object("payment_intents", pi_id)
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_intents/{pi_id}/_authenticate",
        data={"client_secret": pi["client_secret"], "success": "true"},
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    return r.status_code


def test_resolving_awaiting_buyer_failed_cancels_the_payment_intent_first(
    new_purchase, api_client, resolver, localstripe
):
    purchase, op = _awaiting_buyer(new_purchase, api_client)

    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="buyer abandoned 3-D Secure",
        actor="resolver-1",
        acting_user=resolver,
    )

    assert provider_object("payment_intents", op.provider_reference)["status"] == "canceled"
    assert (op.outcome, op.grade, op.verification) == ("failed", "confirmed", "provider")
    assert ProviderCall.objects.filter(operation=op, purpose="dispatch", step="cancel").count() == 1
    assert (
        AuditEntry.objects.filter(target_id=op.id, action="operation_cancel_at_provider").count()
        == 1
    )
    assert Resolution.objects.filter(operation_id=op.id).count() == 1
    # 3-D Secure can no longer complete it
    assert _authenticate(op.provider_reference) == 400
    assert localstripe.succeeded_charges_for(purchase.id) == []
    assert _status(purchase) == PurchaseStatus.PAYMENT_FAILED


def test_resolving_awaiting_buyer_failed_is_refused_if_the_cancel_fails(
    new_purchase, api_client, resolver, drill, localstripe
):
    purchase, op = _awaiting_buyer(new_purchase, api_client)
    drill(op, DrillMode.TIMEOUT_BEFORE_SEND, step="cancel")

    with pytest.raises(services.DomainError) as err:
        services.operation_resolve_manual(
            operation_id=op.id,
            outcome="failed",
            reason="buyer abandoned 3-D Secure",
            actor="resolver-1",
            acting_user=resolver,
        )

    assert err.value.code == "provider_cancel_failed"
    op = _reload(op)
    assert op.outcome == Outcome.AWAITING_BUYER
    assert provider_object("payment_intents", op.provider_reference)["status"] == "requires_action"
    assert Resolution.objects.filter(operation_id=op.id).count() == 0
    # the attempted write is audited all the same
    assert (
        AuditEntry.objects.filter(target_id=op.id, action="operation_cancel_at_provider").count()
        == 1
    )
    assert localstripe.succeeded_charges_for(purchase.id) == []


def test_api_resolution_the_provider_contradicts_is_a_409_naming_its_record(
    new_purchase, api_client, drill, client, localstripe
):
    from tests.factories import make_client

    _resolver, key = make_client(
        name="resolver-tool", scopes=("purchases:read", "operations:resolve")
    )
    purchase, op = _unknown_charge(new_purchase, api_client, drill)

    r = client.post(
        f"/api/v1/operations/{op.id}/resolve",
        data={"outcome": "failed", "reason": "buyer says declined"},
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="resolve-1",
        HTTP_AUTHORIZATION=f"Api-Key {key}",
    )

    assert r.status_code == 409, r.content
    body = r.json()
    assert body["code"] == "provider_contradicts" and "'succeeded'" in body["detail"]
    assert Resolution.objects.filter(operation_id=op.id).count() == 0
    assert _reload(op).outcome == Outcome.SUCCEEDED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1


def test_manual_succeeded_on_a_confirm_the_provider_never_applied_is_refused(
    new_purchase, api_client, drill, resolver, localstripe
):
    # given a payment whose confirm answered 409 and was never applied at the provider
    # (the PaymentIntent stays requires_confirmation: no money moved)
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.HTTP_409)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN

    # when a resolver says it succeeded
    with pytest.raises(services.DomainError) as err:
        services.operation_resolve_manual(
            operation_id=op.id,
            outcome="succeeded",
            reason="buyer says it went through",
            actor="resolver-1",
            acting_user=resolver,
        )

    # then the provider's record wins: refused, nothing recorded, no sale, hold reserved
    assert err.value.code == "provider_contradicts" and err.value.status == 409
    assert err.value.extra["provider"]["status"] == "requires_confirmation"
    assert _reload(op).outcome == Outcome.UNKNOWN
    assert Resolution.objects.filter(operation_id=op.id).count() == 0
    assert _status(purchase) != PurchaseStatus.PAID
    assert _hold(op) == HoldState.RESERVED
    assert localstripe.succeeded_charges_for(purchase.id) == []


def test_a_dashboard_refund_after_a_compensated_duplicate_is_recorded_against_its_charge(
    new_purchase, api_client, drill, read_drill, resolver, localstripe, deliver
):
    """Found by the lifecycle machine: the duplicate's compensating refund was counted
    against the purchase's own charge, so a dashboard refund of that charge exceeded the
    purchase-wide room and was quarantined `mismatch:amount` (the money never booked)."""
    # given a purchase charged twice whose duplicate a linked refund returned
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    compensation = PaymentOperation.objects.get(parent=first, kind="refund")
    assert services.operation_dispatch(operation_id=compensation.id).outcome == "succeeded"

    # when a person refunds part of the purchase's own charge in the provider's dashboard
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/refunds",
        timeout=10,
        auth=(settings.STRIPE_API_KEY, ""),
        data={"payment_intent": retry.provider_reference, "amount": 500},
    )
    r.raise_for_status()

    # then Verity records it, once, against that charge
    assert deliver(provider_object("refunds", r.json()["id"]), "refund.created") == "applied"
    external = PaymentOperation.objects.get(provider_reference=r.json()["id"])
    assert (external.origin, external.parent_id, external.amount, external.outcome) == (
        "provider",
        retry.id,
        500,
        "succeeded",
    )
    assert [x["amount"] for x in localstripe.refunds_for(retry.provider_reference)] == [500]
