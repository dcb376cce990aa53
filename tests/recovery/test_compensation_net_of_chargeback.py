"""Verity's own compensation meets a chargeback: a failed step (the last unit sold
elsewhere) decides a compensating refund, held back by the `refunds` halt; meanwhile the
bank's chargeback is lost (the buyer has the money back). When the halt lifts, no
compensation may return it a second time. No person or client asks anything here.
Judged on localstripe's dispute and refunds."""

import pytest
import requests
from django.conf import settings

from payments.models import Product
from recovery.halts import halt_clear, halt_set
from recovery.models import StepRun, StepState
from recovery.orchestrator import purchase_fulfil
from tests.outbox import settle
from tests.recovery.test_goods_follow_the_money import (  # noqa: F401  (fixtures)
    _dispute,
    _event,
    _move,
    webhook_secrets,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _withdrawn(dispute_id: str) -> int:
    r = requests.get(
        f"{settings.STRIPE_API_BASE}/v1/disputes/{dispute_id}",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    return -sum(t["amount"] for t in r.json()["balance_transactions"] if t["amount"] < 0)


def test_a_compensation_held_by_the_halt_returns_nothing_after_a_lost_chargeback(
    client, new_purchase, pay_now, localstripe
):
    purchase = new_purchase(stock=1)
    Product.objects.filter(sku=purchase.quote.items[0]["sku"]).update(stock=0)  # sold out
    halt_set(name="refunds", reason="hold compensation for a look", actor="op1")
    charge = pay_now(purchase)
    settle()
    assert (
        StepRun.objects.get(purchase_id=purchase.id, step="inventory").state
        == StepState.COMPENSATED
    )
    dispute = _dispute(charge.provider_charge)
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    halt_clear(name="refunds", actor="op1", reason="go ahead")
    purchase_fulfil(purchase_id=purchase.id)
    settle()
    refunded = sum(
        r["amount"]
        for r in localstripe.refunds_for(charge.provider_reference)
        if r["status"] == "succeeded"
    )
    back = _withdrawn(dispute) + refunded
    assert back <= charge.amount, (
        f"bank withdrew {_withdrawn(dispute)}, compensation refunded {refunded}: {back} back "
        f"for {charge.amount} paid"
    )
