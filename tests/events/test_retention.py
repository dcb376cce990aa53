"""Retention: events older than EVENTS_RETENTION_DAYS go with their deliveries, and an
ACP order event's delivery (it has no event) goes after as long."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from events.models import EndpointKind, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from events.services import events_prune

pytestmark = pytest.mark.django_db(transaction=True)


def test_old_order_event_deliveries_are_pruned_with_their_log(settings):
    settings.EVENTS_RETENTION_DAYS = 30
    endpoint = WebhookEndpoint.objects.create(
        kind=EndpointKind.ACP, api_client_id="platform", url="https://platform.example/h"
    )
    now = timezone.now()

    def put(message_id: str, age_days: int) -> WebhookDelivery:
        d = WebhookDelivery.objects.create(
            endpoint=endpoint,
            message_id=message_id,
            body='{"type":"order_create"}',
            purchase_id="pur_x",
            give_up_at=now,
        )
        WebhookDelivery.objects.filter(pk=d.pk).update(created_at=now - timedelta(days=age_days))
        WebhookAttempt.objects.create(delivery=d, status_code=200)
        return d

    put("evt_old", 31)
    kept = put("evt_new", 29)
    assert events_prune() == 1
    assert list(WebhookDelivery.objects.values_list("pk", flat=True)) == [kept.pk]
    assert WebhookAttempt.objects.count() == 1
    assert events_prune() == 0
