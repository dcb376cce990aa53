"""/metrics: Prometheus text from the default registry, gauges read from the database."""

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from payments import services as pay
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)


def _scrape(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_expose_unknown_operations_and_counters(client, new_purchase, api_client, drill):
    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "http_500")
    pay.operation_dispatch(operation_id=op.id)
    # A real replay: the same quote request sent twice with one Idempotency-Key. The
    # counter is read before and after, so only the API's own increment can pass.
    before = _scrape(client).get(
        ("verity_idempotent_replays_total", (("route", "quotes_create"),)), 0
    )
    _, key = make_client(limit=10_000_000, name="metrics-replayer")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    body = {
        "items": [{"sku": purchase.quote.items[0]["sku"], "quantity": 1}],
        "currency": purchase.currency,
    }
    first = api.post("/api/v1/quotes", body, format="json", HTTP_IDEMPOTENCY_KEY="metrics-1")
    again = api.post("/api/v1/quotes", body, format="json", HTTP_IDEMPOTENCY_KEY="metrics-1")
    assert (first.status_code, again.status_code) == (201, 200)  # 200: the stored answer
    assert again.json()["id"] == first.json()["id"]

    metrics = _scrape(client)

    assert metrics[("verity_unknown_operations", ())] == 1
    assert metrics[("verity_unknown_oldest_age_seconds", ())] >= 0
    assert metrics[("verity_outbox_backlog", ())] >= 1
    assert ("verity_compensation_needed", ()) in metrics
    assert metrics[("verity_operations", (("kind", "charge"), ("outcome", "unknown")))] == 1
    assert metrics[("verity_idempotent_replays_total", (("route", "quotes_create"),))] == before + 1
    assert ("verity_order_after_payment_seconds_count", ()) in metrics
