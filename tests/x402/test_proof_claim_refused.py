"""A read whose proving log another operation already claimed is refused by the database
(x402_one_op_per_proving_log) and is not silent: the operation stays open for a person,
the refusal is on its history, and the metric the alert VerityX402ProofClaimRefused reads
counts it."""

from __future__ import annotations

import pytest

from payments import services
from payments.models import OperationTransition, PaymentOperation, X402Authorization
from payments.services.x402_reads import PROOF_CLAIM_REFUSED_CAUSE
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refused_claim_is_on_the_history_and_counted(agent, report, chain):
    payer = chain.new_payer()
    chain.automine(False)  # both pending: neither has claimed its log yet
    ops = []
    for _ in range(2):
        purchase = agent.new_purchase(report.sku)
        required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
        header, _auth = sign(required, payer)
        assert (
            agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header}).status_code
            == 202
        )
        ops.append(PaymentOperation.objects.get(purchase_id=purchase["id"]))
    chain.mine()
    chain.automine(True)
    first, second = ops
    # The second's transfer log, read from its receipt; (wrongly) held by the first's row
    # already, e.g. written by an earlier bug: the second's own read must not take it too.
    tx = X402Authorization.objects.get(pk=second.id).transaction_hash
    receipt = chain.w3.eth.get_transaction_receipt(tx)
    index = next(
        int(log["logIndex"])
        for log in receipt["logs"]
        if len(log["topics"]) == 3
        and log["address"] == chain.token.address
        and log["topics"][0] == chain.w3.keccak(text="Transfer(address,address,uint256)")
    )
    X402Authorization.objects.filter(pk=first.id).update(
        proof_transaction=tx, proof_log_index=index
    )
    services.operation_reconcile(operation_id=second.id, actor="test")
    second.refresh_from_db()
    assert second.outcome != "succeeded", second.outcome  # not paid by a claimed log
    rows = OperationTransition.objects.filter(operation=second, cause=PROOF_CLAIM_REFUSED_CAUSE)
    assert rows.count() == 1
    assert rows.get().evidence["claimed_by"] == first.id
    from recovery.metrics import _x402_gauges

    gauges = {m.name: m.samples[0].value for m in _x402_gauges(second.created_at) if m.samples}
    assert gauges["verity_x402_proof_claims_refused"] == 1
    settle_outbox()
