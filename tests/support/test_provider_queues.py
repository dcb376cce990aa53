"""Console queues for money the provider moved on its own: disputes (finance, nearest
evidence deadline first, due-within-48-hours flagged) and operations made outside
Verity (a finance user reviews each, audited; support only reads)."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from payments.enums import Grade, OperationKind, Origin, Outcome, PurchaseStatus, Stage
from payments.models import Dispute, PaymentOperation
from support.models import AuditEntry

from .builders import SUCCEEDED, purchase_in

pytestmark = pytest.mark.django_db


def disputed_purchase(due_in: timedelta, dispute_id: str):
    purchase = purchase_in(PurchaseStatus.DISPUTED, ops=[SUCCEEDED])
    Dispute.objects.create(
        id=dispute_id,
        purchase=purchase,
        payment=purchase.operations.get(),
        amount=1500,
        currency="usd",
        reason="fraudulent",
        status="needs_response",
        evidence_due_by=timezone.now() + due_in,
        funds_withdrawn=1500,
        fees=1500,
    )
    return purchase


def external_refund(purchase):
    return PaymentOperation.objects.create(
        purchase=purchase,
        kind=OperationKind.REFUND,
        amount=1500,
        currency="usd",
        parent=purchase.operations.get(kind=OperationKind.CHARGE),
        origin=Origin.PROVIDER,
        outcome=Outcome.SUCCEEDED,
        stage=Stage.SETTLED,
        grade=Grade.CONFIRMED,
        verification="webhook",
        provider_reference="re_dashboard_1",
    )


def test_disputes_queue_lists_the_nearest_deadline_first_and_flags_48_hours(login):
    later = disputed_purchase(timedelta(days=6), "dp_later")
    soon = disputed_purchase(timedelta(hours=30), "dp_soon")

    html = login("finance").get(reverse("support:queue", args=["disputes"])).content.decode()

    assert html.index("dp_soon") < html.index("dp_later")
    assert soon.pk in html and later.pk in html
    assert html.count("due within 48 h") == 1
    dashboard = login("finance").get(reverse("support:dashboard")).content.decode()
    assert 'data-queue="disputes"' in dashboard
    assert login("support").get(reverse("support:queue", args=["disputes"])).status_code == 403


def test_an_external_operation_waits_until_finance_acknowledges_it(login):
    purchase = purchase_in(PurchaseStatus.REFUNDED, ops=[SUCCEEDED])
    op = external_refund(purchase)
    url = reverse("support:queue", args=["external"])
    assert op.pk in login("support").get(url).content.decode()

    refused = login("support").post(
        reverse("support:external-review", args=[op.pk]), {"reason": "seen", "confirm": "yes"}
    )
    done = login("finance").post(
        reverse("support:external-review", args=[op.pk]),
        {"reason": "Dana refunded it in the dashboard", "confirm": "yes"},
    )

    assert refused.status_code == 403
    assert done.status_code == 302
    op.refresh_from_db(fields=["reviewed_at", "reviewed_by"])
    assert op.reviewed_at is not None and op.reviewed_by == "fred"
    assert op.pk not in login("finance").get(url).content.decode()
    assert (
        AuditEntry.objects.filter(target_id=op.pk, action="external_operation_review").count() == 1
    )
    assert AuditEntry.objects.filter(target_id=op.pk, action="console.external_review").count() == 1
    again = login("finance").post(
        reverse("support:external-review", args=[op.pk]), {"reason": "again", "confirm": "yes"}
    )
    assert again.status_code == 302
    assert (
        AuditEntry.objects.filter(target_id=op.pk, action="external_operation_review").count() == 1
    )
