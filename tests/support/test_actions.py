"""Console actions through the views, with effects counted in the DB and at localstripe:
manual resolution, reconcile now, refunds (request, four-eyes approval, dispatch),
halts, quarantine triage, notes. Each writes its audit row with actor, IP and reason."""

from __future__ import annotations

import pytest
from django.urls import reverse

from payments.enums import Grade, Outcome, PurchaseStatus, Verification
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from recovery.models import WorkflowHalt
from support.customer_copy import StateCode, customer_state
from support.models import AuditEntry, Note, Resolution
from webhooks.models import EventResult, ProviderEvent

from .builders import UNKNOWN, purchase_in

CONFIRM = {"confirm": "yes"}


def _unknown_payment(new_purchase, drill, api_client):
    """A real unknown: the confirm reached localstripe, the answer was dropped."""
    from payments import services as pay

    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = pay.operation_dispatch(operation_id=op.pk)
    assert op.outcome == Outcome.UNKNOWN
    return purchase, op


@pytest.mark.django_db(transaction=True)
def test_operator_resolves_unknown_with_reason(login, new_purchase, drill, api_client, localstripe):
    purchase, op = _unknown_payment(new_purchase, drill, api_client)
    url = reverse("support:resolve", args=[op.pk])

    # Support may look but not resolve.
    assert (
        login("support").post(url, {"outcome": "succeeded", "reason": "x", **CONFIRM}).status_code
        == 403
    )
    # An empty reason is refused and changes nothing.
    client = login("operator")
    client.post(url, {"outcome": "succeeded", "reason": "  ", **CONFIRM})
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.UNKNOWN
    assert Resolution.objects.count() == 0

    response = client.post(
        url,
        {
            "outcome": "succeeded",
            **CONFIRM,
            "reason": "Stripe dashboard shows the charge succeeded",
        },
    )
    assert response.status_code == 302
    op = PaymentOperation.objects.get(pk=op.pk)
    assert op.outcome == Outcome.SUCCEEDED
    # The resolution reads the provider back first; it agrees, so the provider's record
    # settles it (graded confirmed) and the person's resolution is recorded beside it.
    assert op.grade == Grade.CONFIRMED and op.verification == Verification.PROVIDER
    # (fulfilling/completed if a Celery worker from another module runs the steps)
    assert Purchase.objects.get(pk=purchase.pk).status in (
        PurchaseStatus.PAID,
        PurchaseStatus.FULFILLING,
        PurchaseStatus.COMPLETED,
    )
    resolution = Resolution.objects.get(operation_id=op.pk)
    assert resolution.actor == "olga" and "dashboard" in resolution.reason
    console = AuditEntry.objects.get(action="console.resolve", target_id=op.pk)
    assert console.actor == "olga" and console.ip == "127.0.0.1"
    # One action, one audit row: the core's own row is suppressed for the console's.
    assert AuditEntry.objects.filter(target_id=op.pk).count() == 1
    assert console.before["outcome"] == "unknown" and console.after["outcome"] == "succeeded"
    assert console.before["status"] == PurchaseStatus.PAYMENT_UNKNOWN
    # Exactly one charge at the provider: the resolution moved no money.
    assert len(localstripe.succeeded_charges_for(purchase.pk)) == 1
    # The page now shows the manual resolution and its audit entry on the timeline.
    html = client.get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "Manual resolution" in html and "Audit: console.resolve by olga" in html
    # A second resolution is refused (already settled), and audited as refused.
    client.post(url, {"outcome": "failed", "reason": "oops", **CONFIRM})
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.SUCCEEDED
    assert AuditEntry.objects.filter(action="console.resolve.refused").count() == 1


@pytest.mark.django_db(transaction=True)
def test_support_reconciles_now(login, new_purchase, drill, api_client):
    purchase, op = _unknown_payment(new_purchase, drill, api_client)
    client = login("support")
    response = client.post(
        reverse("support:reconcile", args=[op.pk]), {"reason": "customer called", **CONFIRM}
    )
    assert response.status_code == 302
    op = PaymentOperation.objects.get(pk=op.pk)
    assert op.outcome == Outcome.SUCCEEDED and op.verification == Verification.PROVIDER
    entry = AuditEntry.objects.get(action="console.reconcile")
    assert entry.before["outcome"] == "unknown" and entry.after["outcome"] == "succeeded"
    assert customer_state(Purchase.objects.get(pk=purchase.pk)).code in (
        StateCode.PAID_CONFIRMATION_DELAYED,
        StateCode.COMPLETE,
    )


@pytest.mark.django_db(transaction=True)
def test_refund_needs_a_different_finance_user(
    login, new_purchase, pay_now, localstripe, form_token
):
    purchase = new_purchase()
    charge = pay_now(purchase)
    assert charge.outcome == Outcome.SUCCEEDED

    client = login("finance")
    echo = client.post(
        reverse("support:refund-request", args=[purchase.pk]),
        {"reason": "item never shipped", **CONFIRM},
    )
    # The amount (everything refundable) is echoed back before anything is requested.
    assert echo.status_code == 200 and "15.00 USD" in echo.content.decode()
    assert not PaymentOperation.objects.filter(purchase=purchase, kind="refund").exists()
    client.post(
        reverse("support:refund-request", args=[purchase.pk]),
        {
            "step": "confirm",
            "amount_minor": "1500",
            "reason": "item never shipped",
            "form_token": form_token("finance"),
            **CONFIRM,
        },
    )
    refund = PaymentOperation.objects.get(purchase=purchase, kind="refund")
    assert refund.outcome == Outcome.AWAITING_APPROVAL
    assert refund.requested_by_user.get_username() == "fred"
    assert AuditEntry.objects.filter(action="console.refund_request").count() == 1

    # The requester cannot approve their own refund; the button is not offered either.
    html = client.get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "Approve and send" not in html
    client.post(
        reverse("support:refund-approve", args=[refund.pk]),
        {"reason": "approving my own", **CONFIRM},
    )
    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.AWAITING_APPROVAL
    assert AuditEntry.objects.filter(action="console.refund_approve.refused").count() == 1
    assert localstripe.refunds_for(charge.provider_reference) == []
    # Support and operators cannot approve at all.
    for role in ("support", "operator"):
        assert (
            login(role)
            .post(reverse("support:refund-approve", args=[refund.pk]), {"reason": "x", **CONFIRM})
            .status_code
            == 403
        )
    # Customer page: a refund awaiting approval is not announced as a reversal.
    assert customer_state(Purchase.objects.get(pk=purchase.pk)).code != StateCode.REVERSED

    client = login("finance2")
    client.post(
        reverse("support:refund-approve", args=[refund.pk]),
        {"reason": "checked the order", **CONFIRM},
    )
    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert refund.approved_by_user.get_username() == "fiona"
    assert refund.outcome in (Outcome.SUCCEEDED, Outcome.AWAITING_PROVIDER)
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1
    assert customer_state(Purchase.objects.get(pk=purchase.pk)).code == StateCode.REVERSED


def test_halt_and_resume(login):
    client = login("operator")
    client.post(
        reverse("support:halt-set"), {"name": "checkout", "reason": "provider incident", **CONFIRM}
    )
    assert WorkflowHalt.objects.filter(name="checkout").exists()
    html = client.get(reverse("support:dashboard")).content.decode()
    assert "Halted: new dispatches are refused" in html and "provider incident" in html
    client.post(
        reverse("support:halt-clear"), {"name": "checkout", "reason": "resolved", **CONFIRM}
    )
    assert not WorkflowHalt.objects.exists()
    actions = list(
        AuditEntry.objects.filter(action__startswith="console.halt").values_list(
            "action", flat=True
        )
    )
    assert actions == ["console.halt_set", "console.halt_clear"]
    # Without the confirmation tick nothing happens.
    client.post(reverse("support:halt-set"), {"name": "refunds", "reason": "x"})
    assert not WorkflowHalt.objects.exists()
    assert (
        login("finance")
        .post(reverse("support:halt-set"), {"name": "refunds", "reason": "x", **CONFIRM})
        .status_code
        == 403
    )


def test_quarantine_dismiss_and_release(login):
    events = [
        ProviderEvent.objects.create(
            event_id=f"evt_q{i}",
            type="charge.refunded",
            payload={"id": f"re_q{i}"},
            result=EventResult.QUARANTINED,
            result_reason="amount_mismatch",
        )
        for i in range(2)
    ]
    client = login("operator")
    client.post(
        reverse("support:event-triage", args=[events[0].pk, "dismiss"]),
        {"reason": "test event from the dashboard", **CONFIRM},
    )
    assert ProviderEvent.objects.get(pk=events[0].pk).result == EventResult.IGNORED
    client.post(
        reverse("support:event-triage", args=[events[1].pk, "release"]),
        {"reason": "operation corrected", **CONFIRM},
    )
    assert ProviderEvent.objects.get(pk=events[1].pk).result != EventResult.QUARANTINED
    entries = AuditEntry.objects.filter(target_type="provider_event")
    assert sorted(e.action for e in entries) == ["webhook_event_dismiss", "webhook_event_release"]
    assert all(e.ip == "127.0.0.1" and e.actor == "olga" for e in entries)
    assert entries.get(action="webhook_event_dismiss").before["result"] == "quarantined"
    queue = client.get(reverse("support:queue", args=["quarantined"])).content.decode()
    assert "evt_q" not in queue and "Empty." in queue


def test_note_is_recorded_with_ip(login):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    client = login("support")
    client.post(reverse("support:note-add", args=[purchase.pk]), {"reason": "called back"})
    note = Note.objects.get(purchase_id=purchase.pk)
    assert note.body == "called back" and note.author.get_username() == "sam"
    entry = AuditEntry.objects.get(action="console.note_add")
    assert entry.ip == "127.0.0.1" and entry.purchase_id == purchase.pk
    client.post(reverse("support:note-add", args=[purchase.pk]), {"reason": ""})
    assert Note.objects.count() == 1


def test_resume_lists_only_halted_workflows(login, db):
    WorkflowHalt.objects.create(name="refunds", reason="provider refunds failing", halted_by="olga")

    html = login("operator").get(reverse("support:halts")).content.decode()

    resume = html[html.index('id="resume-name"') :]
    resume = resume[: resume.index("</select>")]
    assert "<option>refunds</option>" in resume and "checkout" not in resume
    halt = html[html.index('id="halt-name"') :]
    assert "<option>refunds</option>" not in halt[: halt.index("</select>")]


def test_nothing_halted_offers_no_resume(login, db):
    html = login("operator").get(reverse("support:halts")).content.decode()
    assert 'id="resume-name"' not in html and "Nothing is halted." in html
