"""Every x402 fault through Verity, counting transfers on the real chain.

Rules (docs/x402.md#reconciled-from-the-chain-only): at most one transfer per purchase;
`unknown` or `awaiting` is never shown `failed` before the chain proves it (the
authorization expired or was cancelled); reconciliation only reads the chain, it never
settles again."""

from __future__ import annotations

import pytest

from payments import services
from payments.models import PaymentOperation, ProviderCall, X402Authorization
from payments.providers.x402 import DrillMode, get_facilitator
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def _pay(agent, report, chain, payer=None):
    purchase = agent.new_purchase(report.sku)
    required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    payer = payer or chain.new_payer()
    header, auth = sign(required, payer)
    return purchase, payer, header, auth


def _send(agent, purchase, header):
    return agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})


def _op(purchase) -> PaymentOperation:
    return PaymentOperation.objects.get(purchase_id=purchase["id"])


def _reconcile(purchase) -> PaymentOperation:
    return services.operation_reconcile(operation_id=_op(purchase).id, actor="test")


def _settles(op) -> int:
    return ProviderCall.objects.filter(operation=op, purpose="dispatch", step="settle").count()


def test_settlement_pending_is_awaiting_with_its_hash_and_the_chain_settles_it(
    agent, report, chain
):
    purchase, payer, header, _auth = _pay(agent, report, chain)
    chain.automine(False)  # broadcast, not mined: the facilitator's receipt wait times out

    r = _send(agent, purchase, header)

    op = _op(purchase)
    assert r.status_code == 202 and r.json()["code"] == "settlement_pending", r.content
    assert "Don't pay again" in r.json()["detail"]
    assert op.outcome == "awaiting_provider" and op.purchase.status == "payment_pending"
    tx = X402Authorization.objects.get(operation=op).transaction_hash
    assert tx and tx in chain.pending()
    assert chain.transfers(payer.address) == 0
    assert _reconcile(purchase).outcome == "awaiting_provider"  # still not mined
    chain.mine()
    settled = _reconcile(purchase)
    assert (settled.outcome, settled.verification) == ("succeeded", "provider")
    assert chain.transfers(payer.address) == 1
    assert _settles(op) == 1


def test_pending_answered_as_http_500_keeps_the_body_and_is_awaiting(agent, report, chain):
    purchase, payer, header, _auth = _pay(agent, report, chain)
    chain.facilitator_config(pending_status=500)  # a hosted facilitator's habit
    chain.automine(False)

    r = _send(agent, purchase, header)

    op = _op(purchase)
    call = ProviderCall.objects.get(operation=op, step="settle")
    assert call.http_status == 500 and call.error_code == "settlement_pending"
    assert op.outcome == "awaiting_provider", r.content
    assert X402Authorization.objects.get(operation=op).transaction_hash
    chain.mine()
    assert _reconcile(purchase).outcome == "succeeded"
    assert chain.transfers(payer.address) == 1


def test_a_dropped_transaction_is_not_a_failure_until_the_authorization_expires(
    agent, report, chain, settings
):
    settings.X402_MAX_TIMEOUT_SECONDS = 60  # a short authorization: expiry comes quickly
    purchase, payer, header, auth = _pay(agent, report, chain)
    chain.automine(False)
    _send(agent, purchase, header)
    tx = X402Authorization.objects.get(operation=_op(purchase)).transaction_hash
    chain.drop(tx)
    chain.automine(True)
    chain.refill_facilitator_nonce()

    still = _reconcile(purchase)
    assert still.outcome == "awaiting_provider"  # absence of evidence is not failure
    assert not chain.authorization_used(payer.address, auth["nonce"])
    chain.expire(int(auth["validBefore"]))
    expired = _reconcile(purchase)
    assert (expired.outcome, expired.reason) == ("failed", "authorization_expired")
    assert expired.verification == "provider"
    assert chain.transfers(payer.address) == 0
    assert _settles(expired) == 1


def test_a_cancelled_authorization_reverts_the_transfer_and_is_failed_by_the_chain(
    agent, report, chain
):
    purchase, payer, header, auth = _pay(agent, report, chain)
    chain.automine(False)
    _send(agent, purchase, header)
    assert _op(purchase).outcome == "awaiting_provider"
    # The payer cancels between the facilitator's verify and the block (higher fee first).
    chain.cancel_authorization(payer, auth["nonce"], gas_price=chain.w3.eth.gas_price * 20)
    chain.mine()

    op = _reconcile(purchase)
    assert (op.outcome, op.reason) == ("failed", "authorization_canceled")
    assert chain.transfers(payer.address) == 0
    receipt = chain.w3.eth.get_transaction_receipt(
        X402Authorization.objects.get(operation=op).transaction_hash
    )
    assert receipt["status"] == 0  # the facilitator's transfer really reverted


def test_a_blocklisted_payer_reverts_but_the_authorization_is_still_usable(agent, report, chain):
    purchase, payer, header, _auth = _pay(agent, report, chain)
    chain.automine(False)
    _send(agent, purchase, header)
    chain.token.functions.blacklist(payer.address).transact(
        {"from": chain.admin, "gasPrice": chain.w3.eth.gas_price * 20}
    )
    chain.mine()

    op = _reconcile(purchase)
    assert op.outcome == "awaiting_provider"  # reverted, not failed: it may still move
    assert chain.transfers(payer.address) == 0


def test_a_reorg_takes_an_unconfirmed_transfer_back_and_nothing_is_settled(
    agent, report, chain, settings
):
    settings.X402_CONFIRMATIONS = 3
    purchase, payer, header, _auth = _pay(agent, report, chain)
    r = _send(agent, purchase, header)
    assert _op(purchase).outcome == "awaiting_provider", r.content  # 1 of 3 confirmations
    assert chain.transfers(payer.address) == 1
    chain.reorg(1)  # the block with the transfer is replaced
    chain.refill_facilitator_nonce()
    chain.mine(3)

    op = _reconcile(purchase)
    assert op.outcome == "awaiting_provider"  # not failed: the authorization is still usable
    assert chain.transfers(payer.address) == 0


def test_an_answer_dropped_after_forwarding_is_unknown_and_the_chain_finds_the_transfer(
    agent, report, chain
):
    purchase, payer, header, auth = _pay(agent, report, chain)
    get_facilitator().arm_drill(
        payer=payer.address, nonce=auth["nonce"], mode=DrillMode.DROP_ANSWER_AFTER_SEND
    )

    r = _send(agent, purchase, header)

    op = _op(purchase)
    assert r.status_code == 202 and op.outcome == "unknown", r.content
    assert X402Authorization.objects.get(operation=op).transaction_hash == ""  # no hash known
    assert chain.transfers(payer.address) == 1
    settled = _reconcile(purchase)
    assert settled.outcome == "succeeded"
    # Found through the AuthorizationUsed log, without a hash from the answer.
    assert X402Authorization.objects.get(operation=op).transaction_hash
    assert (
        settled.provider_reference == X402Authorization.objects.get(operation=op).transaction_hash
    )
    assert chain.transfers(payer.address) == 1
    assert _settles(op) == 1
