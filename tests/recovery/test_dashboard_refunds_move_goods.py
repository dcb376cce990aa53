"""Money moved outside Verity (a refund made in the provider's dashboard) must move the
goods as Verity's own refund does: a full dashboard refund leaves no live order and no
stock taken, and every face says refunded. Refunds made at localstripe over plain HTTP,
reported by a signed `refund.created` event built from localstripe's own object."""

import pytest
import requests
from django.conf import settings

from payments.enums import PurchaseStatus
from payments.models import PaymentOperation, Product
from tests.outbox import settle
from tests.recovery.test_goods_follow_the_money import (  # noqa: F401  (fixtures)
    PRICE,
    _buy,
    _charge,
    _dispute,
    _event,
    _faces_agree,
    _live_orders,
    _move,
    _refunded_at_provider,
    webhook_secrets,
)
from tests.webhooks.events import deliver_and_process, event_for

pytestmark = pytest.mark.django_db(transaction=True)


def _dashboard_refund(purchase_id: str, amount: int) -> dict:
    pi = PaymentOperation.objects.get(purchase_id=purchase_id, kind="charge").provider_reference
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/refunds",
        data={"payment_intent": pi, "amount": amount},
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    return r.json()


def test_a_full_dashboard_refund_after_fulfilment_unwinds_the_goods(client, auto_refund_shop):
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    assert _live_orders(purchase_id) == 1
    refund = _dashboard_refund(purchase_id, PRICE)
    deliver_and_process(client, event_for(refund, "refund.created"))
    settle()
    assert _refunded_at_provider(purchase_id) == PRICE
    assert _live_orders(purchase_id) == 0
    assert Product.objects.get(sku=sku).stock == 10
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_two_dashboard_partial_refunds_making_it_whole_unwind_the_goods(client, auto_refund_shop):
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    for part in (PRICE // 2, PRICE - PRICE // 2):
        deliver_and_process(
            client, event_for(_dashboard_refund(purchase_id, part), "refund.created")
        )
        settle()
    assert _refunded_at_provider(purchase_id) == PRICE
    assert _live_orders(purchase_id) == 0
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_a_dashboard_refund_during_an_inquiry_then_closed_stays_refunded(client, auto_refund_shop):
    from recovery.halts import halt_set
    from tests.recovery.halt_fence import lift_halt_quietly

    halt_set(name="step:order", reason="fence: before fulfilment", actor="test")
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    deliver_and_process(client, event_for(_dashboard_refund(purchase_id, PRICE), "refund.created"))
    settle()
    lift_halt_quietly("step:order")
    _move(inquiry, "warning_closed")
    _event(client, inquiry, "charge.dispute.closed")
    settle()
    assert _refunded_at_provider(purchase_id) == PRICE
    assert _live_orders(purchase_id) == 0
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_a_full_dashboard_refund_mid_fulfilment_ships_nothing_more(client, auto_refund_shop):
    from django.db import transaction

    from recovery.halts import halt_set
    from recovery.models import EmailMessage
    from recovery.outbox import run_steps_put
    from tests.recovery.halt_fence import lift_halt_quietly

    halt_set(name="step:inventory", reason="fence: fulfilment mid-way", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    assert _live_orders(purchase_id) == 1
    deliver_and_process(client, event_for(_dashboard_refund(purchase_id, PRICE), "refund.created"))
    settle()
    lift_halt_quietly("step:inventory")
    with transaction.atomic():
        run_steps_put(purchase_id=purchase_id)
    settle()
    assert _live_orders(purchase_id) == 0
    assert Product.objects.get(sku=sku).stock == 10
    assert EmailMessage.objects.filter(purchase_id=purchase_id, kind="confirmation").count() == 0
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)
