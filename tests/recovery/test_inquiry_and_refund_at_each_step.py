"""Goods follow the money at every step of fulfilment: an inquiry
(`warning_needs_response`: no funds withdrawn) opens while fulfilment is stopped before one
of its steps; the merchant answers with a full refund; the inquiry closes
(`warning_closed`). Closing it restores nothing the money no longer supports: no live
order, the stock back on the shelf, no confirmation e-mail, no deliverable served, and the
faces say `refunded`. And with a partial refund instead, the goods follow what was kept.

Driven through the public REST API (a storefront allowed automatic refunds) and
localstripe's dispute resource, whose signed `charge.dispute.*` events reach the webhook.
Counted at localstripe (refunds, dispute) and in the rows."""

import pytest

from payments.enums import PurchaseStatus
from payments.models import Product
from recovery.halts import halt_set
from recovery.models import EmailMessage, InventoryCommit, StepRun
from tests.outbox import settle
from tests.recovery.halt_fence import lift_halt_quietly
from tests.recovery.test_goods_follow_the_money import (  # noqa: F401 (fixtures)
    PRICE,
    _buy,
    _charge,
    _confirmations,
    _dispute,
    _event,
    _faces_agree,
    _live_orders,
    _move,
    _refund,
    _refunded_at_provider,
    webhook_secrets,
)

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = ["inventory", "ledger", "confirmation", "crm"]


@pytest.mark.parametrize("stopped_before", STEPS)
def test_an_inquiry_answered_with_a_full_refund_mid_fulfilment_unwinds_the_goods(
    stopped_before, client, auto_refund_shop
):
    halt_set(name=f"step:{stopped_before}", reason="fence: mid fulfilment", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    settle()
    _refund(auto_refund_shop, purchase_id)
    settle()
    lift_halt_quietly(f"step:{stopped_before}")
    _move(inquiry, "warning_closed")
    _event(client, inquiry, "charge.dispute.closed")
    settle()

    assert _refunded_at_provider(purchase_id) == PRICE
    assert _live_orders(purchase_id) == 0
    assert Product.objects.get(sku=sku).stock == 10
    assert not InventoryCommit.objects.filter(
        purchase_id=purchase_id, released_at__isnull=True
    ).exists()
    if STEPS.index(stopped_before) <= STEPS.index("confirmation"):
        assert _confirmations(purchase_id) == 0
    # nothing after the halted step ran once the money was back
    later = STEPS[STEPS.index(stopped_before) :]
    assert not StepRun.objects.filter(
        purchase_id=purchase_id, step__in=later, state="done"
    ).exists()
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_a_digital_purchase_refunded_during_an_inquiry_serves_no_deliverable(
    client, auto_refund_shop
):
    from recovery.models import StepName

    purchase_id, _ = _buy(auto_refund_shop, kind="digital")
    settle()
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    _refund(auto_refund_shop, purchase_id)
    settle()
    _move(inquiry, "warning_closed")
    _event(client, inquiry, "charge.dispute.closed")
    settle()
    from django.utils import timezone

    assert _refunded_at_provider(purchase_id) == PRICE
    assert (
        not StepRun.objects.filter(purchase_id=purchase_id, step=StepName.DELIVERABLE, state="done")
        .exclude(result_expires_at__lte=timezone.now())
        .exists()
    )
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


@pytest.mark.parametrize("stopped_before", ["inventory", "confirmation"])
def test_an_inquiry_answered_with_a_partial_refund_mid_fulfilment_keeps_the_goods(
    stopped_before, client, auto_refund_shop
):
    halt_set(name=f"step:{stopped_before}", reason="fence: mid fulfilment", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    _refund(auto_refund_shop, purchase_id, amount=500)
    settle()
    lift_halt_quietly(f"step:{stopped_before}")
    _move(inquiry, "warning_closed")
    _event(client, inquiry, "charge.dispute.closed")
    settle()

    assert _refunded_at_provider(purchase_id) == 500
    assert _live_orders(purchase_id) == 1
    assert Product.objects.get(sku=sku).stock == 9
    assert _confirmations(purchase_id) == 1
    assert EmailMessage.objects.filter(purchase_id=purchase_id, kind="cancellation").count() == 0
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.COMPLETED)
