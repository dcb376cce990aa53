"""A chargeback of part of a payment (the bank took 500 of 2000 back), lost. The merchant
kept 1500; the buyer had 500 back. Goods follow the money as for a partial refund (the
order stays) — or, if Verity treats any lost dispute as all the money back, the books and
the room must agree with that. Judged on localstripe's dispute and refunds and the rows."""

import pytest
import requests
from django.conf import settings

from payments.models import Purchase
from tests.outbox import settle
from tests.recovery.test_goods_follow_the_money import (  # noqa: F401  (fixtures)
    PRICE,
    _buy,
    _charge,
    _event,
    _live_orders,
    _move,
    _refunded_at_provider,
    webhook_secrets,
)

pytestmark = pytest.mark.django_db(transaction=True)

PART = 500


def _partial_chargeback(charge: str) -> str:
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/_config/disputes",
        data={"charge": charge, "reason": "product_not_received", "amount": PART},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["id"]


def test_a_lost_partial_chargeback_keeps_goods_and_room_consistent(client, auto_refund_shop):
    purchase_id, _ = _buy(auto_refund_shop, stock=10)
    settle()
    dispute = _partial_chargeback(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    status = Purchase.objects.get(pk=purchase_id).status
    live = _live_orders(purchase_id)
    body = auto_refund_shop.get(f"purchases/{purchase_id}").json()
    room = body["refunds"].get("refundable")
    # the merchant kept PRICE - PART: goods cancelled with money kept is wrong, and so is
    # a refundable room that would return more than was kept
    assert live == 1, (
        f"bank took {PART} of {PRICE}; order cancelled anyway (status {status}, refundable {room})"
    )
    # and the customer is not told the money went back: most of it did not
    from recovery.models import EmailMessage

    assert not EmailMessage.objects.filter(purchase_id=purchase_id, kind="cancellation").exists()
    from payments.customer_copy import customer_state

    state = customer_state(Purchase.objects.get(pk=purchase_id))
    assert "part of this payment" in state.headline, state.headline


def test_after_a_lost_partial_chargeback_a_refund_returns_at_most_what_was_kept(
    client, auto_refund_shop
):
    purchase_id, _ = _buy(auto_refund_shop, stock=10)
    settle()
    dispute = _partial_chargeback(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    r = auto_refund_shop.post(f"purchases/{purchase_id}/refunds", {})
    settle()
    back = PART + _refunded_at_provider(purchase_id)
    assert back <= PRICE, f"refund answered {r.status_code}: {back} back for {PRICE} paid"
