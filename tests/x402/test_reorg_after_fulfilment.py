"""A reorg after fulfilment is noticed. An x402 payment succeeds at X402_CONFIRMATIONS and
the report goes out; a succeeded payment is then read again until its block is final
(the RPC's `finalized` tag; anvil's trails the head by 64 blocks). When the block is
replaced (anvil_reorg) and the payer cancels the authorization, the transfer can never
come back: the payment becomes a discrepancy with an owner -- failed
`transfer_reversed_on_chain` owned by support, the purchase in manual review, a console
queue row, a metric, the revenue reversed in the ledger, the goods unwound, the customer
told by e-mail. Never a silent state. Everything is counted on the real chain."""

from __future__ import annotations

import pytest
from django.core import mail
from django.db.models import Sum

from bench.x402_judge import claims_from_rows, judge_from_env
from payments import services
from payments.models import PaymentOperation, Purchase, X402Authorization
from payments.services.x402_finality import (
    FINAL,
    REVERSED,
    WATCHING,
    x402_finality_check,
    x402_not_final,
)
from recovery.models import EmailMessage, LedgerEntry, StepRun
from recovery.tasks import x402_finality
from support.queues import queue_items
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def _paid_and_delivered(agent, report, chain):
    payer = chain.new_payer()
    purchase = agent.new_purchase(report.sku)
    required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    header, auth = sign(required, payer)
    assert agent.get(
        f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header}
    ).status_code in (200, 202)
    settle_outbox()
    op = PaymentOperation.objects.get(purchase_id=purchase["id"], kind="charge")
    assert op.outcome == "succeeded", (op.outcome, op.reason)
    assert agent.get(f"purchases/{purchase['id']}/deliverable").status_code == 200
    assert LedgerEntry.objects.filter(purchase_id=purchase["id"]).exists()
    assert chain.transfers(payer.address) == 1
    return payer, purchase, auth, op, header


def _reorg_out(chain, block: int) -> None:
    """Replace every block from the payment's on with empty ones: its transfer is gone."""
    depth = chain.w3.eth.block_number - block + 1
    chain.reorg(depth)
    chain.refill_facilitator_nonce()


def test_a_transfer_gone_after_delivery_is_a_discrepancy_with_an_owner(
    agent, report, chain, django_user_model
):
    payer, purchase, auth, op, _header = _paid_and_delivered(agent, report, chain)
    row = X402Authorization.objects.get(pk=op.id)
    assert row.final_at is None and x402_not_final().filter(pk=op.id).exists()
    assert x402_finality_check(operation_id=op.id) == WATCHING  # 1 block deep, not final

    _reorg_out(chain, row.block_number)
    chain.cancel_authorization(payer, auth["nonce"])  # the payer makes sure it never lands
    chain.mine()
    assert chain.transfers(payer.address) == 0
    assert chain.authorization_used(payer.address, auth["nonce"])

    assert x402_finality()  # the beat's sweep
    settle_outbox()
    op.refresh_from_db()
    # The operation: failed, the chain's word, owned by support.
    assert (op.outcome, op.reason, op.grade, op.next_action_owner) == (
        "failed",
        "transfer_reversed_on_chain",
        "confirmed",
        "support",
    )
    assert Purchase.objects.get(id=purchase["id"]).status == "manual_review"
    # The revenue booked for it is reversed: the purchase's ledger nets to zero.
    entries = LedgerEntry.objects.filter(purchase_id=purchase["id"])
    assert entries.filter(entry_type__endswith="_reversal").exists()
    assert entries.filter(account="provider_balance").aggregate(s=Sum("amount"))["s"] == 0
    # The goods: the report is no longer served.
    assert agent.get(f"purchases/{purchase['id']}/deliverable").status_code != 200
    assert (
        StepRun.objects.get(purchase_id=purchase["id"], step="deliverable").result_expires_at
        is not None
    )
    # The customer is told, once.
    told = EmailMessage.objects.get(purchase_id=purchase["id"], kind="payment_reversed")
    assert told.sent_at is not None
    assert (
        sum(
            1
            for m in mail.outbox
            if "did not complete" in m.subject and purchase["id"] in m.subject
        )
        == 1
    )
    # A console queue row and the metric the alert reads.
    assert [i.ref for i in queue_items("x402_transfers_reversed")] == [op.id]
    from recovery.metrics import _x402_gauges

    gauges = {m.name: m.samples[0].value for m in _x402_gauges(op.created_at) if m.samples}
    assert gauges["verity_x402_transfers_reversed_open"] == 1
    assert gauges["verity_x402_transfers_reversed"] == 1
    # Read again: nothing happens twice.
    assert x402_finality_check(operation_id=op.id) == WATCHING
    settle_outbox()
    assert (
        EmailMessage.objects.filter(purchase_id=purchase["id"])
        .filter(kind="payment_reversed")
        .count()
        == 1
    )
    # The judge, from the raw chain: nothing counted that did not arrive.
    audit = judge_from_env().audit(
        claims_from_rows(X402Authorization.objects.filter(pk=op.id).select_related("operation")),
        settled=True,
    )
    assert audit.violations == [] and audit.counted == 0 == audit.received
    # Support marks it reviewed: the queue row closes.
    person = django_user_model.objects.create(username="support-reorg")
    services.operation_overturn_review(
        operation_id=op.id, actor=person.username, reason="buyer e-mailed; report withdrawn"
    )
    assert queue_items("x402_transfers_reversed") == []


def test_a_transfer_that_may_land_again_is_read_again_not_judged(agent, report, chain):
    """Reorged out, but the authorization is still usable (not cancelled, not expired):
    the transfer may be mined again. Still succeeded; read again."""
    payer, purchase, auth, op, _header = _paid_and_delivered(agent, report, chain)
    row = X402Authorization.objects.get(pk=op.id)
    chain.automine(False)
    _reorg_out(chain, row.block_number)
    assert x402_finality_check(operation_id=op.id) == WATCHING
    op.refresh_from_db()
    assert op.outcome == "succeeded"
    assert not EmailMessage.objects.filter(
        purchase_id=purchase["id"], kind="payment_reversed"
    ).exists()


def test_a_final_block_is_not_read_again(agent, report, chain):
    _payer, _purchase, _auth, op, _header = _paid_and_delivered(agent, report, chain)
    chain.mine(70)  # past anvil's `finalized` block (64 behind the head)
    assert x402_finality_check(operation_id=op.id) == FINAL
    row = X402Authorization.objects.get(pk=op.id)
    assert row.final_at is not None
    assert not x402_not_final().filter(pk=op.id).exists()
    assert x402_finality_check(operation_id=op.id) == FINAL
    assert REVERSED != FINAL
