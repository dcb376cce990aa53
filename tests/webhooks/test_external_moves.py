"""Money the provider moved without Verity: a refund made in the provider's dashboard (a
plain refund at localstripe, no Verity metadata), a capture or a cancel of an
authorization made there. Each is recorded once as an external linked operation
(`origin: provider`) so status, refundable amount, holds, ledger and settlement stay true,
and a further refund through the API is refused."""

import pytest
import requests
from django.conf import settings
from django.db.models import Sum

from payments.enums import HoldState, OperationKind, Origin, Outcome, PurchaseStatus
from payments.models import Hold, PaymentOperation, Purchase
from recovery.models import LedgerEntry, SettlementDiscrepancy
from recovery.settlement import settlement_compare
from support.models import AuditEntry
from tests.localstripe import provider_object
from tests.outbox import settle
from webhooks.models import EventResult

from .events import deliver_and_process, event_for

pytestmark = pytest.mark.django_db(transaction=True)


def at_provider(method: str, path: str, **data) -> dict:
    """What a person does in the provider's dashboard: no Verity key, no metadata."""
    r = requests.request(
        method,
        f"{settings.STRIPE_API_BASE}/v1/{path}",
        data=data,
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    return r.json()


def external_ops(purchase, kind=None):
    qs = PaymentOperation.objects.filter(purchase=purchase, origin=Origin.PROVIDER)
    return qs.filter(kind=kind) if kind else qs


def refund_via_api(api, purchase, amount=None, key="rf-1"):
    return api.post(
        f"/api/v1/purchases/{purchase.pk}/refunds",
        {} if amount is None else {"amount": amount},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def provider_balance(purchase_id: str) -> int:
    return (
        LedgerEntry.objects.filter(purchase_id=purchase_id, account="provider_balance").aggregate(
            s=Sum("amount")
        )["s"]
        or 0
    )


def test_a_dashboard_refund_turns_the_purchase_refunded_and_the_api_refuses_more(
    client, api, new_purchase, pay, localstripe
):
    purchase = new_purchase()
    op = pay(purchase)
    settle()
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference)

    result = deliver_and_process(
        client, event_for(provider_object("refunds", refund["id"]), "refund.created")
    )
    settle()  # OPERATION_SETTLED books the refund in the ledger

    assert result == EventResult.APPLIED
    [ext] = external_ops(purchase)
    assert (
        ext.kind,
        ext.outcome,
        ext.amount,
        ext.provider_reference,
        ext.parent_id,
        ext.verification,
    ) == (OperationKind.REFUND, Outcome.SUCCEEDED, 1500, refund["id"], op.pk, "webhook")
    assert api.get(f"/api/v1/purchases/{purchase.pk}").json()["status"] == "refunded"
    assert api.get(f"/api/v1/operations/{ext.pk}").json()["origin"] == "provider"
    audit = AuditEntry.objects.get(action="external_operation_recorded", target_id=ext.pk)
    assert audit.reason == "made outside Verity"

    # the Charge's own event says the same: nothing new is recorded
    charge = provider_object("charges", op.provider_charge)
    assert charge["amount_refunded"] == 1500
    deliver_and_process(client, event_for(charge, "charge.refunded"))
    settle()
    assert external_ops(purchase).count() == 1

    refused = refund_via_api(api, purchase, amount=100)
    assert refused.status_code == 422 and refused.json()["code"] == "refund_exceeds_refundable"
    assert PaymentOperation.objects.filter(purchase=purchase, kind="refund").count() == 1
    assert len(localstripe.refunds_for(op.provider_reference)) == 1
    assert LedgerEntry.objects.filter(operation_id=ext.pk, entry_type="refund").count() == 2
    assert provider_balance(purchase.pk) == 0
    settlement_compare(grace_seconds=0)
    assert not SettlementDiscrepancy.objects.filter(
        provider_reference__in=[op.provider_charge, refund["id"]], resolved_at__isnull=True
    ).exists()


def test_charge_refunded_alone_is_read_back_and_a_partial_refund_limits_the_api(
    client, api, new_purchase, pay, localstripe
):
    purchase = new_purchase()
    op = pay(purchase)
    settle()
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference, amount=500)
    charge = provider_object("charges", op.provider_charge)

    deliver_and_process(client, event_for(charge, "charge.refunded"))
    settle()  # PROVIDER_REFUNDS_READ lists the refunds at the provider

    [ext] = external_ops(purchase, OperationKind.REFUND)
    assert (ext.provider_reference, ext.amount, ext.verification) == (refund["id"], 500, "provider")
    assert Purchase.objects.get(pk=purchase.pk).status != PurchaseStatus.REFUNDED
    refused = refund_via_api(api, purchase, amount=1500)
    assert refused.status_code == 422
    assert refused.json()["refundable"] == 1000
    assert len(localstripe.refunds_for(op.provider_reference)) == 1


def test_verity_s_own_refund_event_is_never_recorded_as_external(
    client, new_purchase, pay, localstripe
):
    from payments import services

    purchase = new_purchase()
    op = pay(purchase)
    settle()
    own = services.refund_request(purchase_id=purchase.pk, compensation=True)
    own = services.operation_dispatch(operation_id=own.pk)
    assert own.outcome == Outcome.SUCCEEDED

    event = event_for(provider_object("refunds", own.provider_reference), "refund.created")
    assert deliver_and_process(client, event) == EventResult.IGNORED
    deliver_and_process(
        client, event_for(provider_object("charges", op.provider_charge), "charge.refunded")
    )
    settle()

    assert external_ops(purchase).count() == 0
    assert len(localstripe.refunds_for(op.provider_reference)) == 1


def test_a_capture_made_at_the_provider_is_recorded_and_consumes_the_hold(
    client, api, new_purchase, pay, localstripe
):
    purchase = new_purchase()
    auth = pay(purchase, capture="manual")
    assert auth.outcome == Outcome.SUCCEEDED
    intent = at_provider("POST", f"payment_intents/{auth.provider_reference}/capture")
    assert intent["status"] == "succeeded"

    assert (
        deliver_and_process(client, event_for(intent, "payment_intent.succeeded"))
        == EventResult.APPLIED
    )
    settle()

    [ext] = external_ops(purchase)
    assert (ext.kind, ext.outcome, ext.parent_id) == (
        OperationKind.CAPTURE,
        Outcome.SUCCEEDED,
        auth.pk,
    )
    assert Hold.objects.get(operation=auth).state == HoldState.CONSUMED
    refused = api.post(
        f"/api/v1/purchases/{purchase.pk}/capture", {}, format="json", HTTP_IDEMPOTENCY_KEY="cap-1"
    )
    assert refused.status_code == 409
    assert LedgerEntry.objects.filter(operation_id=ext.pk, entry_type="sale").count() == 2
    assert [pi["status"] for pi in localstripe.payment_intents_for(purchase.pk)] == ["succeeded"]


def test_a_cancel_made_at_the_provider_voids_the_purchase_and_releases_the_hold(
    client, new_purchase, pay, localstripe
):
    purchase = new_purchase()
    auth = pay(purchase, capture="manual")
    intent = at_provider("POST", f"payment_intents/{auth.provider_reference}/cancel")
    assert intent["status"] == "canceled"

    assert (
        deliver_and_process(client, event_for(intent, "payment_intent.canceled"))
        == EventResult.APPLIED
    )
    settle()

    [ext] = external_ops(purchase)
    assert (ext.kind, ext.outcome) == (OperationKind.VOID, Outcome.SUCCEEDED)
    assert Hold.objects.get(operation=auth).state == HoldState.RELEASED
    assert Purchase.objects.get(pk=purchase.pk).status in (
        PurchaseStatus.VOIDED,
        PurchaseStatus.CANCELLED,
    )
    assert [pi["status"] for pi in localstripe.payment_intents_for(purchase.pk)] == ["canceled"]


def test_an_external_refund_that_disagrees_with_the_books_is_quarantined(client, new_purchase, pay):
    purchase = new_purchase()
    op = pay(purchase)
    settle()
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference)
    event = event_for(provider_object("refunds", refund["id"]), "refund.created")
    event["data"]["object"]["amount"] = 99_999

    assert deliver_and_process(client, event) == EventResult.QUARANTINED
    assert external_ops(purchase).count() == 0


def test_a_refund_awaiting_approval_is_refused_once_the_provider_refunded_outside_verity(
    client, api, new_purchase, pay, localstripe, django_user_model
):
    from payments import services
    from payments.services import DomainError

    purchase = new_purchase()
    op = pay(purchase)
    settle()
    asked = refund_via_api(api, purchase)  # waits for a finance approval
    assert asked.status_code in (200, 201, 202), asked.content
    pending = PaymentOperation.objects.get(purchase=purchase, kind="refund")
    assert pending.outcome == Outcome.AWAITING_APPROVAL
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference)
    assert (
        deliver_and_process(
            client, event_for(provider_object("refunds", refund["id"]), "refund.created")
        )
        == EventResult.APPLIED
    )
    finance = django_user_model.objects.create_user("fin-ext", password="x")

    with pytest.raises(DomainError) as refused:
        services.refund_approve(
            operation_id=pending.pk, acting_user=finance, reason="customer asked"
        )

    assert refused.value.code == "refund_exceeds_refundable"
    settle()
    assert PaymentOperation.objects.get(pk=pending.pk).outcome == Outcome.AWAITING_APPROVAL
    assert len(localstripe.refunds_for(op.provider_reference)) == 1


def test_a_compensation_refunds_only_what_the_dashboard_refund_left(
    client, new_purchase, pay, localstripe
):
    from payments.models import Product
    from recovery.halts import halt_clear, halt_set
    from recovery.orchestrator import purchase_fulfil

    purchase = new_purchase()
    Product.objects.filter(sku=purchase.quote.items[0]["sku"]).update(stock=0)  # inventory fails
    halt_set(name="refunds", reason="hold the compensation", actor="op1")
    op = pay(purchase)
    settle()  # the inventory step is refused: compensation decided, held by the halt
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference, amount=500)
    assert (
        deliver_and_process(
            client, event_for(provider_object("refunds", refund["id"]), "refund.created")
        )
        == EventResult.APPLIED
    )

    halt_clear(name="refunds", actor="op1", reason="go ahead")
    purchase_fulfil(purchase_id=purchase.pk)
    settle()

    [compensation] = PaymentOperation.objects.filter(purchase=purchase, is_compensation=True)
    assert (compensation.amount, compensation.outcome) == (1000, Outcome.SUCCEEDED)
    assert sorted(r["amount"] for r in localstripe.refunds_for(op.provider_reference)) == [
        500,
        1000,
    ]
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.REFUNDED
    [ext] = external_ops(purchase)
    for refund_op in (ext, compensation):
        assert (
            LedgerEntry.objects.filter(operation_id=refund_op.pk, entry_type="refund").count() == 2
        )


def test_a_pending_dashboard_refund_holds_the_slot_until_the_provider_settles_it(
    client, api, new_purchase, pay, localstripe
):
    from payments import services

    purchase = new_purchase()
    op = pay(purchase)
    settle()
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference)
    pending = provider_object("refunds", refund["id"])
    pending["status"] = "pending"  # Stripe answers pending for slower methods

    assert deliver_and_process(client, event_for(pending, "refund.created")) == EventResult.APPLIED
    [ext] = external_ops(purchase)
    assert ext.outcome == Outcome.AWAITING_PROVIDER
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.REFUND_PENDING
    assert refund_via_api(api, purchase, amount=100).status_code in (409, 422)

    services.operation_reconcile(operation_id=ext.pk)  # reads re_… back: succeeded
    again = event_for(provider_object("refunds", refund["id"]), "refund.updated")
    assert deliver_and_process(client, again) == EventResult.IGNORED  # already settled
    settle()

    ext = PaymentOperation.objects.get(pk=ext.pk)
    assert (ext.outcome, ext.verification) == (Outcome.SUCCEEDED, "provider")
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.REFUNDED
    assert external_ops(purchase).count() == 1
    assert len(localstripe.refunds_for(op.provider_reference)) == 1
    assert LedgerEntry.objects.filter(operation_id=ext.pk, entry_type="refund").count() == 2


def test_redelivered_provider_events_about_external_operations_are_ignored(
    client, new_purchase, pay
):
    purchase = new_purchase()
    op = pay(purchase)
    settle()
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference)
    body = provider_object("refunds", refund["id"])
    deliver_and_process(client, event_for(body, "refund.created"))

    assert deliver_and_process(client, event_for(body, "refund.updated")) == EventResult.IGNORED
    assert external_ops(purchase).count() == 1

    auth_purchase = new_purchase()
    auth = pay(auth_purchase, capture="manual")
    intent = at_provider("POST", f"payment_intents/{auth.provider_reference}/cancel")
    deliver_and_process(client, event_for(intent, "payment_intent.canceled"))
    assert (
        deliver_and_process(client, event_for(intent, "payment_intent.canceled"))
        == EventResult.IGNORED
    )
    assert external_ops(auth_purchase).count() == 1


@pytest.mark.parametrize("unsettled", ["payment", "capture"])
def test_a_dashboard_refund_of_a_payment_verity_has_not_settled_yet_is_held_then_recorded(
    client, api_client, new_purchase, pay, drill, localstripe, unsettled
):
    """The dashboard refunds a charge whose answer Verity lost
    (or whose capture it has not confirmed yet). The event must wait for Verity's record,
    not be quarantined as a mismatch: a refund the provider made is never lost."""
    from payments import services
    from webhooks.models import ProviderEvent

    purchase = new_purchase()
    if unsettled == "payment":
        op = pay(purchase, drop_response=True)
        waiting = op
    else:
        op = pay(purchase, capture="manual")
        settle()
        capture = services.capture_create(purchase_id=purchase.pk, api_client=api_client)
        drill(capture, "drop_response_after_send", step="capture")
        waiting = services.operation_dispatch(operation_id=capture.id)
    assert waiting.outcome == Outcome.UNKNOWN
    refund = at_provider("POST", "refunds", payment_intent=op.provider_reference, amount=600)
    event = event_for(provider_object("refunds", refund["id"]), "refund.created")

    # when the event arrives before Verity settled its own record
    assert deliver_and_process(client, event) == EventResult.HELD
    assert external_ops(purchase).count() == 0

    # then once the reconciler confirms the payment, the held event is retried at once
    # (not at its backoff) and records the refund
    assert services.operation_reconcile(operation_id=waiting.id).outcome == Outcome.SUCCEEDED
    settle()
    assert ProviderEvent.objects.get(event_id=event["id"]).result == EventResult.APPLIED
    [ext] = external_ops(purchase, OperationKind.REFUND)
    assert (ext.outcome, ext.amount, ext.provider_reference) == (
        Outcome.SUCCEEDED,
        600,
        refund["id"],
    )
    sources = {op.provider_charge or PaymentOperation.objects.get(pk=op.pk).provider_charge}
    charge_net = sum(
        t["net"]
        for t in localstripe.list("balance_transactions")
        if t["source"] in sources | {refund["id"]}
    )
    assert provider_balance(purchase.pk) == charge_net == 1500 - 600
