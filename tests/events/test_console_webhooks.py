"""The console's webhooks page: support sees endpoints and the delivery log, operators
turn an endpoint off and on and resend a delivery (with a reason, audited), and no page
shows a signing secret."""

from __future__ import annotations

import pytest
from django.urls import reverse

from audit.models import AuditEntry
from events import services
from events.models import DeliveryState, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def endpoint(shop, receiver, loopback_allowed):
    made = services.endpoint_create(api_client_id=shop.client.pk, url=receiver.url, actor="test")
    return made


def test_support_sees_the_page_without_the_secret(login, endpoint, shop, product):  # noqa: F811
    shop.new_purchase(product.sku)
    page = login("support").get(reverse("support:webhooks"))
    assert page.status_code == 200
    html = page.content.decode()
    assert endpoint.endpoint.url in html
    assert endpoint.secret not in html and endpoint.endpoint.secret_salt not in html
    assert "Disable" not in html  # support sees, operators change


def test_an_operator_disables_and_enables_with_a_reason(login, endpoint):  # noqa: F811
    client = login("operator")
    url = reverse("support:webhook-endpoint-enabled", args=[endpoint.endpoint.id, "disable"])
    client.post(url, {"reason": "receiver is down for maintenance", "confirm": "yes"})
    stored = WebhookEndpoint.objects.get(pk=endpoint.endpoint.id)
    assert not stored.enabled
    assert stored.disabled_reason == "receiver is down for maintenance"
    url = reverse("support:webhook-endpoint-enabled", args=[endpoint.endpoint.id, "enable"])
    client.post(url, {"reason": "back", "confirm": "yes"})
    assert WebhookEndpoint.objects.get(pk=endpoint.endpoint.id).enabled
    assert (
        AuditEntry.objects.filter(
            target_type="webhook_endpoint", action="webhook_endpoint_update"
        ).count()
        == 2
    )


def test_support_cannot_change_an_endpoint(login, endpoint):  # noqa: F811
    url = reverse("support:webhook-endpoint-enabled", args=[endpoint.endpoint.id, "disable"])
    answer = login("support").post(url, {"reason": "x", "confirm": "yes"})
    assert answer.status_code == 403
    assert WebhookEndpoint.objects.get(pk=endpoint.endpoint.id).enabled


def test_an_operator_resends_a_failed_delivery(login, endpoint, shop, product):  # noqa: F811
    from recovery.relay import relay_drain_once

    shop.new_purchase(product.sku)
    relay_drain_once()
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(state=DeliveryState.FAILED)
    login("operator").post(
        reverse("support:webhook-delivery-resend", args=[delivery.pk]),
        {"reason": "the storefront asked", "confirm": "yes"},
    )
    assert WebhookDelivery.objects.get().state == DeliveryState.PENDING
    assert AuditEntry.objects.filter(action="webhook_delivery_resend").count() == 1


def test_the_purchase_page_links_its_delivery_log(login, endpoint, shop, product):  # noqa: F811
    from recovery.relay import relay_drain_once

    purchase = shop.new_purchase(product.sku)
    relay_drain_once()
    client = login("support")
    page = client.get(reverse("support:purchase", args=[purchase["id"]])).content.decode()
    assert f"/console/webhooks/?purchase={purchase['id']}" in page
    log = client.get(reverse("support:webhooks") + f"?purchase={purchase['id']}")
    assert log.status_code == 200
    assert f'data-delivery="{WebhookDelivery.objects.get().pk}"' in log.content.decode()
