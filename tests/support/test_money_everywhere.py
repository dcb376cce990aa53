"""Every amount a person reads goes through payments.money: a zero-decimal currency (JPY)
and a three-decimal one (KWD) read the same on every surface — the confirmation e-mail,
the console (purchase, queues, dashboard and its chart), the customer page and its JSON, the
REST `customer_message` and the MCP tool answers.

A surface that divides by 100 itself shows 1 000 JPY as "10.00 JPY" and 1 500 KWD
(1.500 KWD) as "15.00 KWD"; each case lists those wrong readings and asserts them absent.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from agents import tools
from payments import services as pay
from payments.enums import (
    Grade,
    HoldState,
    OperationKind,
    Origin,
    Outcome,
    PurchaseStatus,
    Stage,
)
from payments.models import Dispute, Hold, PaymentOperation
from recovery.halts import halt_set
from recovery.models import EmailMessage
from recovery.orchestrator import purchase_fulfil
from tests.factories import ProductFactory, PurchaseFactory, QuoteFactory, make_client
from tests.outbox import settle
from tests.recovery.halt_fence import lift_halt_quietly

from .builders import SUCCEEDED

# (currency, amount in minor units, what a person must read, what a hand /100 shows)
CASES = [
    pytest.param("jpy", 1000, "1,000 JPY", ("10.00 JPY", "10.00"), id="JPY-zero-decimals"),
    pytest.param("kwd", 1500, "1.500 KWD", ("15.00 KWD", "15.00"), id="KWD-three-decimals"),
]


def _reads(text: str, shown: str, wrong: tuple[str, ...]) -> None:
    assert shown in text
    for bad in wrong:
        assert bad not in text, f"{bad!r} in {text!r}"


def _purchase(currency: str, amount: int, status: str, *, client=None, ops=()):
    quote = QuoteFactory(
        amount=amount,
        currency=currency,
        items=[{"sku": "LAMP-1", "name": "Desk lamp", "quantity": 1, "unit_price": amount}],
    )
    purchase = PurchaseFactory(quote=quote, status=status, api_client=client)
    for fields in ops:
        fields = {"kind": OperationKind.CHARGE, "amount": amount, "currency": currency, **fields}
        PaymentOperation.objects.create(purchase=purchase, **fields)
    return purchase


def _partly_refunded(currency: str, amount: int, refunded: int, *, client=None):
    purchase = _purchase(
        currency, amount * 2, PurchaseStatus.COMPLETED, client=client, ops=[SUCCEEDED]
    )
    PaymentOperation.objects.create(
        purchase=purchase,
        kind=OperationKind.REFUND,
        amount=refunded,
        currency=currency,
        parent=purchase.operations.get(kind=OperationKind.CHARGE),
        outcome=Outcome.SUCCEEDED,
        stage=Stage.SETTLED,
        grade=Grade.CONFIRMED,
        verification="provider",
        provider_reference=f"re_{currency}_part",
    )
    return purchase


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("currency, amount, shown, wrong", CASES)
def test_confirmation_email_reads_the_currencys_own_decimals(currency, amount, shown, wrong):
    client = make_client(currency=currency, limit=10_000_000)[0]
    product = ProductFactory(price=amount, currency=currency)
    quote = pay.quote_create(
        api_client=client, items=[{"sku": product.sku, "quantity": 1}], currency=currency
    )
    purchase = pay.purchase_create(
        api_client=client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference=f"money-{currency}",
        customer_email="buyer@example.com",
    )
    # The confirmation step waits at a halt, so this process sends it (locmem backend).
    halt_set(name="step:confirmation", reason="test fence", actor="test")
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=client, payment_method="pm_card_visa"
    )
    assert pay.operation_dispatch(operation_id=op.pk).outcome == Outcome.SUCCEEDED
    settle()
    lift_halt_quietly("step:confirmation")
    before = len(mail.outbox)

    purchase_fulfil(purchase_id=purchase.pk)

    sent = [m for m in mail.outbox[before:] if m.to == ["buyer@example.com"]]
    assert len(sent) == 1
    assert (
        EmailMessage.objects.filter(
            purchase_id=purchase.pk, kind="confirmation", sent_at__isnull=False
        ).count()
        == 1
    )
    _reads(sent[0].body, f"Your payment of {shown} is confirmed", wrong)


@pytest.mark.django_db
@pytest.mark.parametrize("currency, amount, shown, wrong", CASES)
def test_console_pages_read_the_currencys_own_decimals(login, currency, amount, shown, wrong):
    purchase = _purchase(currency, amount, PurchaseStatus.DISPUTED, ops=[SUCCEEDED])
    charge = purchase.operations.get()
    Dispute.objects.create(
        id=f"dp_{currency}",
        purchase=purchase,
        payment=charge,
        amount=amount,
        currency=currency,
        reason="fraudulent",
        status="needs_response",
        evidence_due_by=timezone.now() + timedelta(days=5),
        funds_withdrawn=amount,
        fees=amount,
    )
    PaymentOperation.objects.create(
        purchase=purchase,
        kind=OperationKind.REFUND,
        amount=amount,
        currency=currency,
        parent=charge,
        origin=Origin.PROVIDER,
        outcome=Outcome.SUCCEEDED,
        stage=Stage.SETTLED,
        grade=Grade.CONFIRMED,
        verification="webhook",
        provider_reference=f"re_dashboard_{currency}",
    )
    client = make_client(currency=currency, name=f"shop-{currency}")[0]
    unknown = _purchase(
        currency,
        amount,
        PurchaseStatus.PAYMENT_UNKNOWN,
        ops=[
            {
                "outcome": Outcome.UNKNOWN,
                "stage": Stage.RECONCILING,
                "provider_reference": f"pi_unknown_{currency}",
            }
        ],
    )
    Hold.objects.create(
        api_client=client,
        operation=unknown.operations.get(),
        amount=amount,
        currency=currency,
        state=HoldState.RESERVED,
    )
    finance = login("finance")

    pages = {
        "purchase": finance.get(reverse("support:purchase", args=[purchase.pk])),
        "disputes": finance.get(reverse("support:queue", args=["disputes"])),
        "external": finance.get(reverse("support:queue", args=["external"])),
        "unknown": finance.get(reverse("support:queue", args=["unknown"])),
        "dashboard": finance.get(reverse("support:dashboard")),
        "chart": finance.get(reverse("support:chart", args=["money-at-risk"])),
    }

    for name, response in pages.items():
        assert response.status_code == 200, name
        _reads(response.content.decode(), shown, wrong)


@pytest.mark.django_db
@pytest.mark.parametrize("currency, amount, shown, wrong", CASES)
def test_customer_page_json_and_rest_message_read_the_currencys_own_decimals(
    client, currency, amount, shown, wrong
):
    api_client, key = make_client(currency=currency)
    purchase = _partly_refunded(currency, amount, amount, client=api_client)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")

    page = client.get(reverse("support:status", args=[purchase.status_token]))
    state = client.get(reverse("support:status-json", args=[purchase.status_token]))
    rest = api.get(f"/api/v1/purchases/{purchase.pk}")

    assert page.status_code == state.status_code == rest.status_code == 200
    refund_words = f"confirmed a refund of {shown}"
    _reads(page.content.decode(), refund_words, wrong)
    _reads(state.json()["message"], refund_words, wrong)
    _reads(rest.json()["customer_message"], refund_words, wrong)


@pytest.mark.django_db
@pytest.mark.parametrize("currency, amount, shown, wrong", CASES)
def test_mcp_answers_read_the_currencys_own_decimals(currency, amount, shown, wrong):
    api_client = make_client(currency=currency)[0]
    product = ProductFactory(price=amount, currency=currency)
    quoted = tools.get_quote(
        api_client=api_client,
        currency=currency,
        items=[tools.QuoteItem(sku=product.sku, quantity=1)],
    )
    purchase = _partly_refunded(currency, amount, amount, client=api_client)

    got = tools.get_purchase(api_client=api_client, purchase_id=purchase.pk)

    assert quoted.refusal is None and got.refusal is None
    _reads(quoted.instruction, shown, wrong)
    _reads(got.purchase["customer_message"], f"confirmed a refund of {shown}", wrong)


@pytest.mark.django_db
@pytest.mark.parametrize("currency, amount, shown, wrong", CASES)
def test_rest_refusal_detail_reads_the_currencys_own_decimals(currency, amount, shown, wrong):
    api_client, key = make_client(currency=currency)
    purchase = _partly_refunded(currency, amount, amount, client=api_client)  # room: amount
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")

    refused = api.post(
        f"/api/v1/purchases/{purchase.pk}/refunds",
        {"amount": amount + 1},
        format="json",
        HTTP_IDEMPOTENCY_KEY=f"too-much-{currency}",
    )

    assert refused.status_code == 422, refused.content
    assert refused.json()["code"] == "refund_exceeds_refundable"
    _reads(refused.json()["detail"], f"Refundable now: {shown}", wrong)
    assert (
        PaymentOperation.objects.filter(purchase=purchase, kind=OperationKind.REFUND).count() == 1
    )
