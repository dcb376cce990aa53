"""The lifecycle machine's `goods_follow_the_money` judge on the example of seed
3955478403192537988678844369410925590, its steps called directly: a full refund whose answer
was a 500 (made at localstripe, `unknown` in Verity), then its earlier `pending` state
delivered. Verity was told of the refund, not that the money went back: the judge must not
count it until Verity is told it succeeded (an event saying so, or its own read-back)."""

import pytest

import tests.lifecycle.test_state_machine as machine
from payments.enums import Outcome
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode
from recovery.models import Order
from tests.lifecycle.test_state_machine import LifecycleMachine
from tests.outbox import settle

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refund_told_only_as_pending_is_not_money_gone_back(monkeypatch):
    monkeypatch.setattr(machine, "event", lambda *a, **kw: None)  # outside a Hypothesis test
    m = LifecycleMachine()
    try:
        pid = m._fresh_purchase(0, m.product.sku)
        m.purchases.append((pid, 0))
        assert m.shops[0].pay(pid, "pm_card_visa").status_code == 201
        machine._settle_outbox_quietly()
        assert Order.objects.filter(purchase_id=pid, cancelled_at__isnull=True).exists()
        m.refund(i=0, partial=False, drill=DrillMode.HTTP_500)
        # i=0 picks the unsettled operation: the refund, sent as `pending`, twice
        m.deliver_event(i=0, late=False, twice=True, earlier=True)
        refund = PaymentOperation.objects.get(purchase_id=pid, kind="refund")
        assert refund.outcome == Outcome.AWAITING_PROVIDER
        m.goods_follow_the_money()  # before: "the money went back at the provider, ..."
        assert m._money_went_back()[pid] is False
        # the provider's own word that it succeeded: now it counts, and the goods went back
        m.deliver_event(i=0, late=False, twice=False, earlier=False)
        assert m._money_went_back()[pid] is True
        m.goods_follow_the_money()
        settle()  # the unwind (one relay drain per machine step may leave it due)
        assert not m._still_settling(pid)
        m.goods_follow_the_money()
        assert not Order.objects.filter(purchase_id=pid, cancelled_at__isnull=True).exists()
    finally:
        m.teardown()
