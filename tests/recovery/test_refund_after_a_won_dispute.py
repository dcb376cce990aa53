"""A chargeback the merchant won, then the merchant refunds the buyer in full anyway (a
goodwill refund, through the public API): the money went back, so the goods unwind and
every face says refunded, never "completed"/"won". Counted at localstripe and in the DB."""

import pytest

from payments.enums import PurchaseStatus
from payments.models import Product, Purchase
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

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_full_refund_after_a_won_chargeback_says_refunded_and_unwinds(client, auto_refund_shop):
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "won")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTE_WON
    assert _live_orders(purchase_id) == 1
    r = auto_refund_shop.post(f"purchases/{purchase_id}/refunds", {})
    assert r.status_code in (201, 202), r.content
    settle()
    assert _refunded_at_provider(purchase_id) == PRICE
    assert _live_orders(purchase_id) == 0, "money back in full, order still live"
    assert Product.objects.get(sku=sku).stock == 10
    from acp.sessions import order_status
    from payments.customer_copy import customer_state

    purchase = Purchase.objects.get(pk=purchase_id)
    body = auto_refund_shop.get(f"purchases/{purchase_id}").json()
    state = customer_state(purchase)
    assert body["status"] == PurchaseStatus.REFUNDED, (
        f"REST says {body['status']!r} with refunds.refunded={body['refunds']['refunded']}; "
        f"ACP order status {order_status(purchase.status)!r}; customer page "
        f"{state.code!r} {state.headline!r}"
    )
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_a_full_refund_after_a_won_chargeback_before_fulfilment_ships_nothing(
    client, auto_refund_shop
):
    from recovery.halts import halt_set
    from recovery.models import EmailMessage, Order
    from tests.recovery.halt_fence import lift_halt_quietly

    # given a paid purchase whose fulfilment has not run (the order step is halted), a
    # chargeback opened and won (fulfilment may resume)
    halt_set(name="step:order", reason="fence: before fulfilment", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "won")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    # when the merchant refunds the buyer in full, and the order writer comes back
    r = auto_refund_shop.post(f"purchases/{purchase_id}/refunds", {})
    assert r.status_code in (201, 202), r.content
    settle()
    assert _refunded_at_provider(purchase_id) == PRICE
    lift_halt_quietly("step:order")
    from django.db import transaction

    from recovery.outbox import run_steps_put

    with transaction.atomic():
        run_steps_put(purchase_id=purchase_id)  # what clearing the halt would kick
    settle()
    # then nothing ships: the money is back with the buyer
    orders = Order.objects.filter(purchase_id=purchase_id, cancelled_at__isnull=True).count()
    confirmations = EmailMessage.objects.filter(
        purchase_id=purchase_id, kind="confirmation"
    ).count()
    stock = Product.objects.get(sku=sku).stock
    assert (orders, confirmations, stock) == (0, 0, 10), (
        f"refunded {PRICE} in full, then: live orders {orders}, confirmation e-mails "
        f"{confirmations}, stock {stock} of 10; purchase "
        f"{Purchase.objects.get(pk=purchase_id).status}"
    )
