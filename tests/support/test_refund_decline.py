"""Finance declines a refund awaiting approval: reason required, audited,
nothing sent to the provider, the refundable amount freed — in the console."""

import pytest
from django.urls import reverse

from payments.enums import Outcome
from payments.models import PaymentOperation
from support.models import AuditEntry
from tests.support.test_actions import CONFIRM


@pytest.mark.django_db(transaction=True)
def test_finance_declines_a_refund_in_the_console(
    login, new_purchase, pay_now, localstripe, form_token
):
    purchase = new_purchase()
    charge = pay_now(purchase)
    fin = login("finance")
    # the console echoes the amount back first; the confirming post requests it
    fin.post(
        reverse("support:refund-request", args=[purchase.pk]),
        {
            "step": "confirm",
            "amount_minor": str(charge.amount),
            "reason": "customer asked",
            "form_token": form_token("finance"),
            **CONFIRM,
        },
    )
    refund = PaymentOperation.objects.get(purchase=purchase, kind="refund")
    assert refund.outcome == Outcome.AWAITING_APPROVAL
    html = fin.get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "Decline refund" in html
    # without a reason: refused, nothing changes
    fin.post(reverse("support:refund-decline", args=[refund.pk]), {"reason": " ", **CONFIRM})
    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.AWAITING_APPROVAL
    # support cannot decline
    login("support").post(
        reverse("support:refund-decline", args=[refund.pk]), {"reason": "no", **CONFIRM}
    )
    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.AWAITING_APPROVAL
    # finance declines
    fin = login("finance")
    fin.post(
        reverse("support:refund-decline", args=[refund.pk]),
        {"reason": "goods not returned", **CONFIRM},
    )
    declined = PaymentOperation.objects.get(pk=refund.pk)
    assert (declined.outcome, declined.reason) == (Outcome.FAILED, "refund_declined")
    assert AuditEntry.objects.filter(action="console.refund_decline").count() == 1
    assert (
        AuditEntry.objects.filter(action="refund_decline", reason="goods not returned").count() == 1
    )
    assert localstripe.refunds_for(charge.provider_reference) == []
    # the amount is refundable again
    fin.post(
        reverse("support:refund-request", args=[purchase.pk]),
        {
            "step": "confirm",
            "amount_minor": str(charge.amount),
            "reason": "second thoughts",
            "form_token": form_token("finance"),
            **CONFIRM,
        },
    )
    assert (
        PaymentOperation.objects.filter(
            purchase=purchase, kind="refund", outcome=Outcome.AWAITING_APPROVAL
        ).count()
        == 1
    )
