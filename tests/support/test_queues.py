"""Dashboard queues: count and oldest age per queue, rows oldest first, and the
settlement queue only for finance."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from payments.enums import HoldState, OperationKind, Outcome, PurchaseStatus, Stage
from payments.models import Hold, PaymentOperation, Purchase
from recovery.models import (
    OutboxCategory,
    OutboxMessage,
    SettlementDiscrepancy,
    StepName,
    StepRun,
    StepState,
)
from support import selectors
from tests.factories import make_client
from webhooks.models import EventResult, ProviderEvent

from .builders import SUCCEEDED, UNKNOWN, purchase_in


def _age(model, pk, field, seconds):
    model.objects.filter(pk=pk).update(**{field: timezone.now() - timedelta(seconds=seconds)})


def _one_case_per_queue():
    older = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    newer = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    _age(PaymentOperation, older.operations.get().pk, "created_at", 3600)
    client = make_client(name="shop-a")[0]
    Hold.objects.create(
        api_client=client,
        operation=older.operations.get(),
        amount=1500,
        currency="usd",
        state=HoldState.RESERVED,
    )
    # Paid without order, past the beat job's grace period.
    stale_paid = purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED])
    _age(Purchase, stale_paid.pk, "updated_at", 3600)
    purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED])  # just paid: not (yet) in the queue
    failed_step = purchase_in(PurchaseStatus.FULFILLING, ops=[SUCCEEDED], order="ORD-9")
    StepRun.objects.create(
        purchase_id=failed_step.pk,
        step=StepName.LEDGER,
        state=StepState.MANUAL,
        key=f"{failed_step.pk}:ledger",
    )
    ProviderEvent.objects.create(
        event_id="evt_dash",
        type="payment_intent.succeeded",
        payload={},
        result=EventResult.QUARANTINED,
        result_reason="amount_mismatch",
    )
    m = OutboxMessage.objects.create(
        category=OutboxCategory.RUN_STEPS,
        payload={"purchase": failed_step.pk},
        dedupe_key="stuck-1",
        attempts=5,
        last_error="boom",
    )
    _age(OutboxMessage, m.pk, "available_at", 900)
    SettlementDiscrepancy.objects.create(
        provider_reference="txn_1",
        kind="missing_in_ledger",
        provider_amount=1500,
        ledger_amount=None,
        currency="usd",
    )
    escalated = purchase_in(
        PurchaseStatus.PAYMENT_UNKNOWN,
        recovery_owner="payments-oncall",
        ops=[{**UNKNOWN, "stage": Stage.ESCALATED, "escalated_at": timezone.now()}],
    )
    refund_parent = purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED], order="ORD-10")
    PaymentOperation.objects.create(
        purchase=refund_parent,
        kind=OperationKind.REFUND,
        amount=500,
        currency="usd",
        outcome=Outcome.AWAITING_APPROVAL,
    )
    return older, newer, escalated


def test_every_queue_counts_its_case(login, db):
    older, newer, escalated = _one_case_per_queue()
    client = login("finance")
    html = client.get(reverse("support:dashboard")).content.decode()
    summaries = {s.spec.name: s for s in selectors.queue_summaries(_finance_user())}
    assert summaries["unknown"].count == 2
    assert summaries["unknown"].oldest_age >= timedelta(minutes=59)
    for name in (
        "paid_without_order",
        "compensation",
        "quarantined",
        "stuck_outbox",
        "settlement",
        "escalated",
        "refund_approval",
    ):
        assert summaries[name].count == 1, name
        assert f'data-queue="{name}"' in html
    # Money at risk: the unknown operation's reserved hold, by currency and client.
    assert "shop-a" in html and "15.00 USD" in html

    rows = client.get(reverse("support:queue", args=["unknown"])).content.decode()
    assert rows.index(older.pk) < rows.index(newer.pk)  # oldest first
    rows = client.get(reverse("support:queue", args=["escalated"])).content.decode()
    assert escalated.pk in rows and "payments-oncall" in rows


def test_settlement_queue_is_finance_only(login, db):
    _one_case_per_queue()
    html = login("support").get(reverse("support:dashboard")).content.decode()
    assert 'data-queue="settlement"' not in html
    assert login("support").get(reverse("support:queue", args=["settlement"])).status_code == 403
    assert login("operator").get(reverse("support:queue", args=["nope"])).status_code == 404


def _finance_user():
    from django.contrib.auth.models import User

    return User.objects.get(username="fred")
