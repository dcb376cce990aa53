"""The console takes and shows money in major units: a refund typed as "10" or "10.00"
requests 1 000 minor units, and only after the amount was echoed back."""

from __future__ import annotations

import pytest
from django.urls import reverse

from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation
from support.models import AuditEntry

CONFIRM = {"confirm": "yes"}
pytestmark = pytest.mark.django_db(transaction=True)


def _refunds(purchase):
    return PaymentOperation.objects.filter(purchase=purchase, kind=OperationKind.REFUND)


@pytest.mark.parametrize("typed", ["10", "10.00"])
def test_typed_major_units_are_echoed_then_requested_in_minor_units(
    login, new_purchase, pay_now, typed, form_token
):
    purchase = new_purchase(price=1500)
    assert pay_now(purchase).outcome == Outcome.SUCCEEDED
    client = login("support")
    url = reverse("support:refund-request", args=[purchase.pk])

    echo = client.post(url, {"amount": typed, "reason": "damaged", **CONFIRM})

    html = echo.content.decode()
    assert echo.status_code == 200
    assert "Refund <strong data-echo-amount>10.00 USD</strong>" in html
    assert 'name="amount_minor" value="1000"' in html
    assert "Refundable now</dt><dd>15.00 USD" in html
    assert not _refunds(purchase).exists()  # nothing requested before the echo

    done = client.post(
        url,
        {
            "step": "confirm",
            "amount_minor": "1000",
            "reason": "damaged",
            "form_token": form_token("support"),
            **CONFIRM,
        },
        follow=True,
    )

    refund = _refunds(purchase).get()
    assert (refund.amount, refund.outcome) == (1000, Outcome.AWAITING_APPROVAL)
    assert "Refund of 10.00 USD requested" in done.content.decode()
    assert AuditEntry.objects.filter(action="console.refund_request").count() == 1


@pytest.mark.parametrize(
    "typed, says",
    [
        ("10.005", "USD amounts have at most 2 decimals"),
        ("ten", "is not an amount in USD"),
        ("0", "more than zero"),
        ("15.01", "15.01 USD is more than is refundable now (15.00 USD)"),
    ],
)
def test_an_amount_that_cannot_be_taken_changes_nothing(login, new_purchase, pay_now, typed, says):
    purchase = new_purchase(price=1500)
    pay_now(purchase)
    client = login("support")

    response = client.post(
        reverse("support:refund-request", args=[purchase.pk]),
        {"amount": typed, "reason": "damaged", **CONFIRM},
        follow=True,
    )

    assert says in response.content.decode()
    assert not _refunds(purchase).exists()
    assert AuditEntry.objects.filter(action__startswith="console.refund_request").count() == 0


def test_core_refusal_names_the_refundable_amount_in_major_units(
    login, new_purchase, pay_now, form_token
):
    purchase = new_purchase(price=1500)
    pay_now(purchase)
    client = login("support")

    # A confirmed amount above the refundable one (e.g. someone refunded meanwhile).
    response = client.post(
        reverse("support:refund-request", args=[purchase.pk]),
        {
            "step": "confirm",
            "amount_minor": "1501",
            "reason": "x",
            "form_token": form_token("support"),
            **CONFIRM,
        },
        follow=True,
    )

    html = response.content.decode()
    assert "Refundable now: 15.00 USD." in html and "1500 usd" not in html
    assert not _refunds(purchase).exists()
