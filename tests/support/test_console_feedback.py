"""Messages say what happened (never "read back" when the provider said nothing), and a
console action writes one audit row."""

from __future__ import annotations

import pytest
from django.urls import reverse

from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode
from support.models import AuditEntry

from .builders import SUCCEEDED, UNKNOWN, purchase_in

CONFIRM = {"confirm": "yes"}
pytestmark = pytest.mark.django_db(transaction=True)


def _messages(response) -> str:
    return " ".join(str(m) for m in response.context["messages"])


def test_read_back_that_finds_nothing_says_so(login, localstripe):
    # An unknown payment whose PaymentIntent the provider has never seen.
    purchase = purchase_in(
        PurchaseStatus.PAYMENT_UNKNOWN, ops=[{**UNKNOWN, "provider_reference": "pi_never_created"}]
    )
    op = purchase.operations.get()

    response = login("support").post(
        reverse("support:reconcile", args=[op.pk]),
        {"reason": "customer called", **CONFIRM},
        follow=True,
    )

    text = _messages(response)
    assert "The provider has no record of this payment yet; it stays unknown." in text
    assert "Read back from the provider." not in response.content.decode()
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.UNKNOWN


def test_read_back_that_settles_says_the_new_outcome(login, new_purchase, drill, api_client):
    from payments import services as pay

    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    assert pay.operation_dispatch(operation_id=op.pk).outcome == Outcome.UNKNOWN

    response = login("support").post(
        reverse("support:reconcile", args=[op.pk]),
        {"reason": "customer called", **CONFIRM},
        follow=True,
    )

    assert (
        "The provider's record settles it: the payment is now succeeded (it was unknown)."
    ) in _messages(response)


def test_manual_resolution_writes_one_audit_row(login, new_purchase, drill, api_client):
    from payments import services as pay

    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    pay.operation_dispatch(operation_id=op.pk)

    login("operator").post(
        reverse("support:resolve", args=[op.pk]),
        {"outcome": "succeeded", "reason": "dashboard shows it paid", **CONFIRM},
    )

    rows = AuditEntry.objects.filter(target_id=op.pk)
    assert [r.action for r in rows] == ["console.resolve"]
    assert rows.get().ip == "127.0.0.1" and rows.get().before["outcome"] == "unknown"


def test_refund_approval_writes_one_audit_row_and_says_what_the_provider_did(
    login, new_purchase, pay_now, localstripe, form_token
):
    purchase = new_purchase(price=1500)
    charge = pay_now(purchase)
    login("finance").post(
        reverse("support:refund-request", args=[purchase.pk]),
        {
            "step": "confirm",
            "amount_minor": "1500",
            "reason": "returned",
            "form_token": form_token("finance"),
            **CONFIRM,
        },
    )
    refund = PaymentOperation.objects.get(purchase=purchase, kind="refund")

    response = login("finance2").post(
        reverse("support:refund-approve", args=[refund.pk]),
        {"reason": "checked", **CONFIRM},
        follow=True,
    )

    assert [r.action for r in AuditEntry.objects.filter(target_id=refund.pk)] == [
        "console.refund_request",
        "console.refund_approve",
    ]
    refund = PaymentOperation.objects.get(pk=refund.pk)
    text = _messages(response)
    if refund.outcome == Outcome.SUCCEEDED:
        assert "Refund of 15.00 USD approved; the provider confirmed it." in text
    else:
        assert "Refund of 15.00 USD approved and accepted by the provider" in text
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1


def test_a_refused_refund_says_why_and_who_acts_next(login, localstripe, form_token):
    # A paid purchase whose PaymentIntent the provider has no record of: it refuses (404).
    purchase = purchase_in(
        PurchaseStatus.COMPLETED,
        ops=[{**SUCCEEDED, "provider_reference": "pi_never_created_refund"}],
    )
    login("finance").post(
        reverse("support:refund-request", args=[purchase.pk]),
        {
            "step": "confirm",
            "amount_minor": "1000",
            "reason": "returned",
            "form_token": form_token("finance"),
            **CONFIRM,
        },
    )
    refund = PaymentOperation.objects.get(purchase=purchase, kind="refund")

    response = login("finance2").post(
        reverse("support:refund-approve", args=[refund.pk]),
        {"reason": "checked", **CONFIRM},
        follow=True,
    )

    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.FAILED
    assert localstripe.refunds_for("pi_never_created_refund") == []
    text = _messages(response)
    assert "the provider refused it (provider_refused: HTTP 404" in text
    assert "no money moved, and 10.00 USD can be refunded again" in text
    assert "Next: support tells the customer" in text
