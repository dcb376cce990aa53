"""Finding a purchase from any reference, and its one timeline in time order."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from payments.enums import CallPurpose, CallStep, Classification, OperationKind, PurchaseStatus
from payments.models import Hold, OperationTransition, PaymentOperation, ProviderCall
from recovery.models import StepName, StepRun, StepState
from support.models import AuditEntry, Note
from webhooks.models import EventResult, ProviderEvent

from .builders import SUCCEEDED, UNKNOWN, purchase_in


@pytest.fixture
def paid(db):
    purchase = purchase_in(
        PurchaseStatus.PAID,
        customer_reference="cust-4411",
        customer_email="Ada@Example.com",
        ops=[{**SUCCEEDED, "provider_reference": "pi_3Search", "provider_charge": "ch_3Search"}],
    )
    charge = purchase.operations.get()
    refund = PaymentOperation.objects.create(
        purchase=purchase,
        kind=OperationKind.REFUND,
        amount=500,
        currency="usd",
        parent=charge,
        outcome="failed",
        provider_reference="re_3Search",
    )
    return purchase, charge, refund


@pytest.mark.parametrize(
    "query",
    [
        "purchase",
        "charge_op",
        "refund_op",
        "pi",
        "ch",
        "re",
        "key",
        "key_step",
        "customer",
        "email",
    ],
)
def test_search_by_each_kind_of_reference(login, paid, query):
    purchase, charge, refund = paid
    q = {
        "purchase": purchase.pk,
        "charge_op": charge.pk,
        "refund_op": refund.pk,
        "pi": "pi_3Search",
        "ch": "ch_3Search",
        "re": "re_3Search",
        "key": charge.idempotency_key,
        "key_step": f"{refund.idempotency_key}:refund",
        "customer": "cust-4411",
        "email": "ada@example.com",
    }[query]
    purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED])  # noise: another purchase
    response = login("support").get(reverse("support:search"), {"q": q})
    assert response.status_code == 302
    assert response["Location"] == reverse("support:purchase", args=[purchase.pk])


def test_search_by_event_object_and_several_matches(login, paid):
    purchase, charge, _ = paid
    ProviderEvent.objects.create(
        event_id="evt_for_py_other",
        type="charge.refunded",
        object_id="py_other",
        operation_id=charge.pk,
        payload={},
    )
    client = login("support")
    assert client.get(reverse("support:search"), {"q": "py_other"})["Location"] == reverse(
        "support:purchase", args=[purchase.pk]
    )
    second = purchase_in(PurchaseStatus.AWAITING_PAYMENT, customer_reference="cust-4411")
    response = client.get(reverse("support:search"), {"q": "cust-4411"})
    assert response.status_code == 200
    html = response.content.decode()
    assert purchase.pk in html and second.pk in html
    response = client.get(reverse("support:search"), {"q": "pi_nothing_here"})
    assert response.status_code == 200 and "No purchase matches" in response.content.decode()


def test_timeline_merges_every_source_in_time_order(login, users, db):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    op = purchase.operations.get()
    t0 = timezone.now()
    # Rows created deliberately out of time order; the timeline must sort them.
    call = ProviderCall.objects.create(
        operation=op,
        purpose=CallPurpose.DISPATCH,
        step=CallStep.CONFIRM,
        key=f"{op.idempotency_key}:confirm",
        http_status=500,
        classification=Classification.UNKNOWN,
        fault_drill="http_500",
    )
    ProviderCall.objects.filter(pk=call.pk).update(started_at=t0 - timedelta(seconds=30))
    event = ProviderEvent.objects.create(
        event_id="evt_tl",
        type="payment_intent.succeeded",
        operation_id=op.pk,
        object_id="pi_test_unknown",
        payload={"id": "pi_test_unknown", "status": "succeeded"},
        result=EventResult.HELD,
    )
    ProviderEvent.objects.filter(pk=event.pk).update(received_at=t0 - timedelta(seconds=10))
    tr = OperationTransition.objects.create(
        purchase=purchase,
        operation=op,
        field="outcome",
        source="dispatching",
        target="unknown",
        cause="http_500",
        actor="dispatcher",
    )
    OperationTransition.objects.filter(pk=tr.pk).update(created_at=t0 - timedelta(seconds=20))
    hold = Hold.objects.create(api_client=_client(), operation=op, amount=op.amount, currency="usd")
    Hold.objects.filter(pk=hold.pk).update(created_at=t0 - timedelta(seconds=40))
    StepRun.objects.create(
        purchase_id=purchase.pk,
        step=StepName.ORDER,
        state=StepState.PENDING,
        key=f"{purchase.pk}:order",
    )
    Note.objects.create(
        purchase_id=purchase.pk, author=users["support"], body="Customer says the card was charged"
    )

    html = login("operator").get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    order = [
        "Hold reserved",
        "Provider dispatch confirm",
        "Operation outcome: dispatching",
        "Webhook payment_intent.succeeded",
        "Step order started",
        "Note by sam",
    ]
    positions = [html.index(marker) for marker in order]
    assert positions == sorted(positions), list(zip(order, positions, strict=False))
    assert "Fault drill" in html
    # Operators see the stored (already safe) payload; support does not.
    assert "Stored payload" in html
    support_html = (
        login("support").get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    )
    assert "Stored payload" not in support_html
    assert "Fault drill" in support_html


def test_purchase_page_shows_customer_words_beside_internal_state(login, db):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    html = login("support").get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "payment_unknown" in html
    assert 'data-customer-code="not_yet_confirmable"' in html
    assert "We are checking your payment" in html
    assert "Owner: reconciliation" in html


def test_event_payload_is_operator_only(login, db):
    event = ProviderEvent.objects.create(
        event_id="evt_pl",
        type="charge.refunded",
        payload={"id": "re_1", "amount": 100},
        result=EventResult.QUARANTINED,
    )
    url = reverse("support:event", args=[event.pk])
    assert "Stored payload" in login("operator").get(url).content.decode()
    html = login("support").get(url).content.decode()
    assert "Stored payload" not in html and "re_1" not in html


def test_audit_entries_appear_on_the_timeline(login, users, db):
    purchase = purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED])
    AuditEntry.objects.create(
        actor="olga",
        action="console.note_add",
        target_type="purchase",
        target_id=purchase.pk,
        purchase_id=purchase.pk,
        reason="why",
    )
    html = login("support").get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "Audit: console.note_add by olga" in html


def _client():
    from tests.factories import make_client

    return make_client(name="timeline")[0]


def test_unmatched_event_naming_the_purchase_is_on_its_timeline(login, db):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    ProviderEvent.objects.create(
        event_id="evt_unmatched",
        type="payment_intent.succeeded",
        object_id="pi_elsewhere",
        purchase_id=purchase.pk,
        payload={},
        result=EventResult.QUARANTINED,
        result_reason="amount_mismatch",
    )
    html = login("support").get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "Webhook payment_intent.succeeded (evt_unmatched)" in html
    queue = login("operator").get(reverse("support:queue", args=["quarantined"])).content.decode()
    assert purchase.pk in queue
