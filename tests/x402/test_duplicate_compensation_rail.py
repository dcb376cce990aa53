"""The compensation of an x402 duplicate is a transfer back to the payer on
the x402 rail, never a card refund (it ended `unknown` for ever on the Stripe rail,
holding the purchase's slot, and the payer's second transfer was never returned).

The duplicate comes from the real chain: a settle whose answer was lost while the
transfer waited in the mempool (automine off), a person's wrong "failed" (the chain showed
nothing yet), a new authorization that paid again; both transfers then mined. Verity itself
now refuses that second authorization while the first failure is only a person's word
(503 `original_unverified` until the chain proves it, at the latest by
expiry), so the given records the failure as chain-confirmed for the moment the agent pays
again (one row write); everything else is the real path. Counted on chain (Transfer logs
payer -> Verity and back) and in the database.
"""

from __future__ import annotations

import pytest

from payments import services
from payments.enums import Grade, Outcome, Verification
from payments.models import PaymentOperation
from payments.providers.x402 import DrillMode, get_facilitator
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_x402_duplicate_is_returned_by_a_transfer_back_on_its_rail(
    agent, report, chain, resolver
):
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    required = agent.get(url).headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    chain.automine(False)
    header, auth = sign(required, payer, payment_id="dup-rail-0001-abcdef")
    get_facilitator().arm_drill(
        payer=payer.address, nonce=auth["nonce"], mode=DrillMode.DROP_ANSWER_AFTER_SEND
    )
    r = agent.get(url, **{SIGNATURE: header})
    [first] = PaymentOperation.objects.filter(purchase_id=purchase["id"])
    assert first.outcome == Outcome.UNKNOWN, r.content

    # the chain shows nothing mined yet: a person says it failed
    first = services.operation_resolve_manual(
        operation_id=first.id,
        outcome="failed",
        reason="payer says nothing left",
        actor="resolver-1",
        acting_user=resolver,
    )
    assert first.outcome == Outcome.FAILED
    # a second authorization is refused while that failure is only the person's word
    other, _auth2 = sign(required, payer, payment_id="dup-rail-0002-abcdef")
    r = agent.get(url, **{SIGNATURE: other})
    assert r.status_code == 503 and r.json()["code"] == "original_unverified", r.content
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    # given the failure had been confirmed, the agent pays again; both transfers are mined
    wrong_word = PaymentOperation.objects.filter(pk=first.pk)
    wrong_word.update(grade=Grade.CONFIRMED, verification=Verification.PROVIDER)
    r = agent.get(url, **{SIGNATURE: other})
    assert r.status_code in (200, 202), r.content
    wrong_word.update(grade=first.grade, verification=first.verification)
    chain.mine(3)
    chain.automine(True)
    second = PaymentOperation.objects.exclude(pk=first.pk).get(
        purchase_id=purchase["id"], kind="charge"
    )
    services.operation_reconcile(operation_id=second.id, actor="test")
    services.operation_reconcile(operation_id=first.id, actor="test")
    assert chain.transfers(payer.address) == 2  # paid twice

    first = PaymentOperation.objects.get(pk=first.pk)
    assert first.is_duplicate and first.outcome == Outcome.SUCCEEDED
    [comp] = PaymentOperation.objects.filter(parent=first, kind="refund")
    assert (comp.rail, comp.is_compensation, comp.amount) == ("x402", True, first.amount)
    settle_outbox()

    # the payer's second transfer came back, once, on the chain; nothing holds the slot
    comp = PaymentOperation.objects.get(pk=comp.pk)
    assert comp.outcome == Outcome.SUCCEEDED
    assert chain.transfers_back(payer.address) == 1
    assert not PaymentOperation.objects.filter(
        purchase_id=purchase["id"],
        outcome__in=("pending", "dispatching", "unknown", "awaiting_provider"),
    ).exists()
