"""Dashboard figures: success-to-order percentiles on the same definition as /metrics'
verity_order_after_payment_seconds, manual interventions per week, open incidents."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from payments.enums import PurchaseStatus
from payments.models import PaymentOperation
from recovery.models import Order
from support import selectors, services
from tests.support.builders import SUCCEEDED, purchase_in

pytestmark = pytest.mark.django_db


def test_success_to_order_percentiles_match_the_metric(client, login, users):
    now = timezone.now()
    for i, delay in enumerate([2, 4, 6, 8, 100]):
        p = purchase_in(
            PurchaseStatus.COMPLETED, ops=[{**SUCCEEDED, "provider_reference": f"pi_lat_{i}"}]
        )
        PaymentOperation.objects.filter(purchase=p).update(settled_at=now - timedelta(minutes=10))
        order = Order.objects.create(purchase_id=p.pk, reference=f"ORD-{i}")
        Order.objects.filter(pk=order.pk).update(
            created_at=now - timedelta(minutes=10) + timedelta(seconds=delay)
        )

    figures = selectors.success_to_order_seconds()
    assert figures["count"] == 5 and figures["median"] == pytest.approx(6, abs=0.5)
    assert figures["p90"] == pytest.approx(100, abs=0.5)
    assert figures["max"] == pytest.approx(100, abs=0.5)

    metrics = client.get("/metrics").content.decode()
    count = re.search(r"^verity_order_after_payment_seconds_count (\S+)$", metrics, re.M)
    assert float(count.group(1)) == figures["count"]

    body = login("support").get("/console/").content.decode()
    assert "over 5 purchases" in body


def test_interventions_per_week_and_open_incidents_on_the_dashboard(login, users):
    inc = services.incident_open(
        user=users["operator"], title="Webhook secret rotated", reason="signature failures"
    )
    weeks = selectors.manual_interventions()["weeks"]
    assert len(weeks) == 4 and weeks[0].incidents == 1 and weeks[0].audited_actions >= 1
    body = login("support").get("/console/").content.decode()
    assert f'data-incident="{inc.pk}"' in body and "Webhook secret rotated" in body
    assert body.count("<tr><td>") >= 4  # one row per week
