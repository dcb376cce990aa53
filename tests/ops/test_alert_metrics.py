"""The metrics added for the alert rules read the same rows as the console queues:
paid-without-order past its grace period, relay lag, read-back failures, halts left on."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from payments.enums import CallPurpose, CallStep, Classification, PurchaseStatus
from payments.models import ProviderCall, Purchase
from recovery import halts
from recovery.models import OutboxCategory, OutboxMessage
from support import selectors
from tests.support.builders import SUCCEEDED, UNKNOWN, purchase_in

pytestmark = pytest.mark.django_db


def _scrape(client) -> dict[str, float]:
    text = client.get("/metrics").content.decode()
    return {
        m.group(1): float(m.group(2)) for m in re.finditer(r"^(verity_[^\s]+) (\S+)$", text, re.M)
    }


def test_alert_inputs_follow_the_database(client, settings):
    settings.PAID_WITHOUT_ORDER_SECONDS = 300
    empty = _scrape(client)
    assert empty["verity_paid_without_order"] == 0
    assert empty["verity_outbox_oldest_due_age_seconds"] == 0
    assert not any(k.startswith("verity_workflow_halt_age_seconds") for k in empty)

    paid = purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED])
    Purchase.objects.filter(pk=paid.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    purchase_in(PurchaseStatus.PAID, ops=[{**SUCCEEDED, "provider_reference": "pi_new"}])
    OutboxMessage.objects.create(
        category=OutboxCategory.NOOP,
        payload={},
        dedupe_key="t:lag",
        available_at=timezone.now() - timedelta(minutes=10),
    )
    unknown = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN]).operations.get()
    for attempt, cls in enumerate(
        [Classification.RETRYABLE, Classification.RETRYABLE, Classification.OK], start=1
    ):
        ProviderCall.objects.create(
            operation=unknown,
            purpose=CallPurpose.RECONCILE,
            step=CallStep.RETRIEVE,
            attempt=attempt,
            classification=cls,
        )
    halts.halt_set(name="checkout", reason="incident drill", actor="olga")

    m = _scrape(client)
    # Only the purchase past the grace period counts; the console queue agrees.
    assert m["verity_paid_without_order"] == 1
    assert m["verity_paid_without_order_oldest_age_seconds"] >= 3500
    assert [i.ref for i in selectors.queue_items("paid_without_order")] == [paid.pk]
    assert m["verity_outbox_oldest_due_age_seconds"] >= 590
    assert m['verity_reconcile_readbacks_recent{classification="retryable"}'] == 2
    assert m['verity_reconcile_readbacks_recent{classification="ok"}'] == 1
    assert 'verity_workflow_halt_age_seconds{name="checkout"}' in m
