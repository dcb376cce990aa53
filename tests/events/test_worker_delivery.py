"""Delivery from a real Celery worker process: the commit's outbox kick fans the event
out, the fan-out's kick sends it; nothing is driven from the test process. A receiver
that fails first still gets every event once."""

from __future__ import annotations

import pytest

from events.models import DeliveryState, Event, WebhookDelivery
from events.services import endpoint_create
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_delivers_every_event_of_a_paid_purchase(
    shop, product, receiver, worker_env, celery_worker
):
    made = endpoint_create(api_client_id=shop.client.pk, url=receiver.url, actor="test")
    receiver.secrets = [made.secret]
    receiver.script = [503, 500]
    purchase = shop.new_purchase(product.sku)
    assert shop.pay(purchase["id"]).status_code == 201

    def all_there() -> bool:
        # The last event first: the events read after it include it (read the other way
        # round, one written in between was missing from `stored` yet counted as there).
        completed = Event.objects.filter(
            purchase_id=purchase["id"], type="purchase.completed"
        ).exists()
        stored = set(
            Event.objects.filter(purchase_id=purchase["id"]).values_list("public_id", flat=True)
        )
        return (
            completed
            and stored <= set(receiver.accepted)
            and not WebhookDelivery.objects.filter(state=DeliveryState.PENDING).exists()
        )

    wait_for(all_there, timeout=60)
    stored = list(Event.objects.filter(purchase_id=purchase["id"]).order_by("sequence"))
    assert set(receiver.accepted) == {e.public_id for e in stored}
    assert receiver.rejected == 0
    assert WebhookDelivery.objects.filter(state=DeliveryState.DELIVERED).count() == len(stored)
