"""Every face says the same about a purchase, here after a chargeback of
part of its payment, lost: the bank gave the buyer 500 of 2000 back, the merchant kept the
rest and the order stays live (tests/recovery/test_partial_chargeback_keeps_goods.py).
The customer's page says part of the payment went back; the ACP session (and the order
webhook, which uses the same words) must not tell the agent the order was refunded in
full. Judged on localstripe's dispute and the rows; the session read over real HTTP."""

from __future__ import annotations

import pytest
import requests
from django.conf import settings

from acp.sessions import order_status
from payments.customer_copy import customer_state
from payments.enums import PurchaseStatus
from payments.models import PaymentOperation, Purchase
from recovery.models import Order
from tests.acp.agent import new_email, valid
from tests.acp.tokens import issue_spt
from tests.outbox import settle
from tests.recovery.test_goods_follow_the_money import _event, _move, webhook_secrets  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

PART = 500


def test_a_lost_partial_chargeback_is_not_a_full_refund_in_the_acp_session(
    agent, tea, client, localstripe
):
    sid = agent.create(tea.sku, 2).json()["id"]
    r = agent.complete(sid, issue_spt(2500), new_email())
    assert r.status_code == 200, r.text
    purchase = Purchase.objects.get(acp_session__id=sid)
    settle()
    charge = PaymentOperation.objects.get(purchase=purchase, kind="charge").provider_charge
    d = requests.post(
        f"{settings.STRIPE_API_BASE}/_config/disputes",
        data={"charge": charge, "reason": "product_not_received", "amount": PART},
        timeout=10,
    )
    d.raise_for_status()
    dispute = d.json()["id"]
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()

    # the provider's record: 500 of 2500 went back, none of it by refund
    [pi] = localstripe.payment_intents_for(purchase.id)
    assert localstripe.refunds_for(pi["id"]) == []
    disputes = [x for x in localstripe.list("disputes") if x["id"] == dispute]
    assert [(x["amount"], x["status"]) for x in disputes] == [(PART, "lost")]
    # the goods stay and the customer's page says part went back
    purchase.refresh_from_db()
    assert purchase.status == PurchaseStatus.DISPUTE_LOST
    assert Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).count() == 1
    assert "part of this payment" in customer_state(purchase).headline

    session = valid("CheckoutSessionWithOrder", agent.get(f"checkout_sessions/{sid}").json())
    said = " ".join(m.get("content", "") for m in session["messages"])
    assert "in full" not in said, said
    assert session["order"]["status"] != "refunded", session["order"]
    assert order_status(purchase.status, purchase.id) != "refunded"  # the order webhook's word
