"""/metrics: Prometheus text from the default registry, gauges read from the database."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from payments import services as pay
from recovery.metrics import IDEMPOTENT_REPLAYS

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


def test_metrics_expose_unknown_operations_and_counters(client, new_purchase, api_client,
                                                       drill):
    purchase = new_purchase()
    op = pay.payment_create(purchase_id=purchase.id, api_client=api_client,
                            payment_method="pm_card_visa")
    drill(op, "http_500")
    pay.operation_dispatch(operation_id=op.id)
    IDEMPOTENT_REPLAYS.labels(route="payments").inc()

    metrics = _scrape(client)

    assert metrics[("verity_unknown_operations", ())] == 1
    assert metrics[("verity_unknown_oldest_age_seconds", ())] >= 0
    assert metrics[("verity_outbox_backlog", ())] >= 1
    assert ("verity_compensation_needed", ()) in metrics
    assert metrics[("verity_operations", (("kind", "charge"), ("outcome", "unknown")))] == 1
    assert metrics[("verity_idempotent_replays_total", (("route", "payments"),))] >= 1
    assert ("verity_order_after_payment_seconds_count", ()) in metrics
