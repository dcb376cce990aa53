"""An authorization cancelled in the provider's dashboard after fulfilment ran: the hold on
the buyer's card is gone, so the goods unwind as after Verity's own void, and every face
says so. The cancel is made at localstripe over plain HTTP and reported by a signed
`payment_intent.canceled` event built from localstripe's own object."""

import pytest
import requests
from django.conf import settings

from payments.enums import PurchaseStatus
from payments.models import PaymentOperation, Product, Purchase
from tests.factories import ProductFactory
from tests.outbox import settle
from tests.recovery.test_goods_follow_the_money import (  # noqa: F401  (fixtures)
    _live_orders,
    webhook_secrets,
)
from tests.webhooks.events import deliver_and_process, event_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_authorization_cancelled_in_the_dashboard_unwinds_the_goods(client, auto_refund_shop):
    product = ProductFactory(price=2000, stock=10)
    purchase = auto_refund_shop.new_purchase(product.sku)
    r = auto_refund_shop.pay(purchase["id"], capture="manual")
    assert r.status_code == 201, r.content
    settle()
    assert _live_orders(purchase["id"]) == 1
    pi = PaymentOperation.objects.get(purchase_id=purchase["id"], kind="authorize")
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_intents/{pi.provider_reference}/cancel",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    deliver_and_process(client, event_for(r.json(), "payment_intent.canceled"))
    settle()
    status = Purchase.objects.get(pk=purchase["id"]).status
    assert _live_orders(purchase["id"]) == 0, f"hold cancelled, order live; status {status}"
    assert Product.objects.get(sku=product.sku).stock == 10
    assert auto_refund_shop.get(f"purchases/{purchase['id']}").json()["status"] in (
        PurchaseStatus.VOIDED,
        PurchaseStatus.CANCELLED,
    )


def test_a_capture_that_finds_the_authorization_cancelled_unwinds_the_goods(
    client, auto_refund_shop
):
    """No event this time (lost, or never sent): Verity learns of the cancel only when its
    own capture meets the cancelled PaymentIntent."""
    product = ProductFactory(price=2000, stock=10)
    purchase = auto_refund_shop.new_purchase(product.sku)
    r = auto_refund_shop.pay(purchase["id"], capture="manual")
    assert r.status_code == 201, r.content
    settle()
    assert _live_orders(purchase["id"]) == 1
    pi = PaymentOperation.objects.get(purchase_id=purchase["id"], kind="authorize")
    requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_intents/{pi.provider_reference}/cancel",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    ).raise_for_status()
    r = auto_refund_shop.post(f"purchases/{purchase['id']}/capture", {})
    settle()
    status = Purchase.objects.get(pk=purchase["id"]).status
    ops = list(
        PaymentOperation.objects.filter(purchase_id=purchase["id"]).values_list(
            "kind", "outcome", "origin"
        )
    )
    # the money is not coming: no live order, or a person owns the purchase
    assert _live_orders(purchase["id"]) == 0 or status == PurchaseStatus.MANUAL_REVIEW, (
        f"capture answered {r.status_code} {r.json().get('code')}; purchase {status}; "
        f"live orders {_live_orders(purchase['id'])}; operations {ops}; next_action "
        f"{auto_refund_shop.get('purchases/' + purchase['id']).json()['next_action']}"
    )
