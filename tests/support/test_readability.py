"""Timeline and audit read as labelled fields (money in major units); the raw JSON is
behind a disclosure, for operators only."""

from __future__ import annotations

from django.urls import reverse

from payments.enums import CallPurpose, CallStep, Classification, PurchaseStatus
from payments.models import ProviderCall

from .builders import UNKNOWN, purchase_in

CONFIRM = {"confirm": "yes"}


def test_audit_row_shows_what_changed_as_labelled_fields(login, transactional_db):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    op = purchase.operations.get()
    login("operator").post(
        reverse("support:resolve", args=[op.pk]),
        {"outcome": "succeeded", "reason": "dashboard shows paid", **CONFIRM},
    )

    operator = login("operator").get(reverse("support:audit")).content.decode()
    support = login("support").get(reverse("support:audit")).content.decode()

    changed = (
        '<span class="k">Outcome</span> <span class="before">unknown</span> → '
        '<span class="after">succeeded</span>'
    )
    assert changed in operator and changed in support
    assert operator.count('data-action="console.resolve"') == 1  # one row per action
    assert "Raw (JSON)" in operator and "Raw (JSON)" not in support


def test_timeline_fields_are_labelled_with_money_in_major_units(login, db):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    op = purchase.operations.get()
    ProviderCall.objects.create(
        operation=op,
        purpose=CallPurpose.RECONCILE,
        step=CallStep.RETRIEVE,
        key="",
        http_status=200,
        classification=Classification.OK,
        safe_fields={"status": "processing", "amount": 1500, "currency": "usd"},
    )

    html = login("support").get(reverse("support:purchase", args=[purchase.pk])).content.decode()

    assert "<dt>Safe fields · Amount</dt><dd>15.00 USD</dd>" in html
    assert "<dt>HTTP status</dt><dd>200</dd>" in html
    assert "&quot;amount&quot;: 1500" not in html  # raw JSON only for operators
    raw = login("operator").get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "Raw fields (JSON)" in raw and "&quot;amount&quot;: 1500" in raw
