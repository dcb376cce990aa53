"""Only money that arrived is a payment. EIP-3009 nonces belong to the
payer and are shared by every transfer of theirs on the token: a used nonce proves a
payment to Verity only when the transaction that used it carries Transfer(payer ->
pay_to, value). Everything counted on the real chain."""

from __future__ import annotations

import pytest

from payments import services
from payments.models import PaymentOperation, ProviderCall, X402Authorization
from payments.providers.x402 import decode_header
from recovery.models import LedgerEntry, StepRun
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)

PRICE_ATOMIC = 1250 * 10**4


def _signed(agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    header, auth = sign(required, payer)
    return purchase, payer, header, auth


def _send(agent, purchase, header):
    return agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})


def _nothing_was_earned(purchase, requester):
    """No deliverable, no ledger revenue, and no refund can be asked for."""
    assert not StepRun.objects.filter(purchase_id=purchase["id"], step="deliverable").exists()
    assert not LedgerEntry.objects.filter(purchase_id=purchase["id"]).exists()
    with pytest.raises(services.DomainError):
        services.refund_request(purchase_id=purchase["id"], acting_user=requester)


@pytest.fixture
def requester(django_user_model):
    return django_user_model.objects.create(username="support-req")


def test_a_nonce_spent_elsewhere_before_the_settle_is_refused_up_front(agent, report, chain):
    purchase, payer, header, auth = _signed(agent, report, chain)
    chain.spend_nonce(payer, auth["nonce"])  # the payer pays itself 1 unit with nonce N

    r = _send(agent, purchase, header)

    assert r.status_code == 402, r.content
    required = decode_header(r.headers["PAYMENT-REQUIRED"])
    assert required["error"] == "invalid_exact_evm_nonce_already_used"
    assert r.json()["code"] == "authorization_used"
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
    assert ProviderCall.objects.filter(operation__purchase_id=purchase["id"]).count() == 0
    assert chain.transfers(payer.address) == 0


def test_a_nonce_spent_elsewhere_after_a_settle_that_did_not_land_is_failed_used_elsewhere(
    agent, report, chain, requester, settings
):
    settings.RECONCILE_ON_DEMAND_COOLDOWN_SECONDS = 0
    purchase, payer, header, auth = _signed(agent, report, chain)
    chain.automine(False)
    _send(agent, purchase, header)  # settlement_pending: broadcast, not mined
    tx = X402Authorization.objects.get(operation__purchase_id=purchase["id"]).transaction_hash
    chain.drop(tx)  # ... and it never lands
    chain.automine(True)
    chain.refill_facilitator_nonce()
    # The payer spends the same nonce on a 1-unit transfer to Verity's own pay_to: a
    # Transfer to pay_to exists, but not of the value, and not by this authorization.
    chain.spend_nonce(payer, auth["nonce"], to=chain.pay_to, value=1)

    replay = _send(agent, purchase, header)  # the agent's retry reads the chain
    settle_outbox()

    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert (op.outcome, op.reason) == ("failed", "authorization_used_elsewhere")
    assert op.verification == "provider"
    assert replay.status_code == 402 and replay.json()["code"] == "payment_failed", replay.content
    assert "PAYMENT-REQUIRED" in replay.headers
    _nothing_was_earned(purchase, requester)
    assert ProviderCall.objects.filter(operation=op, purpose="dispatch", step="settle").count() == 1


def test_a_front_run_of_a_pending_settlement_is_failed_used_elsewhere(
    agent, report, chain, requester
):
    purchase, payer, header, auth = _signed(agent, report, chain)
    chain.automine(False)
    first = _send(agent, purchase, header)
    assert first.status_code == 202 and first.json()["code"] == "settlement_pending"
    ours = X402Authorization.objects.get(operation__purchase_id=purchase["id"]).transaction_hash
    # The payer front-runs the facilitator's transaction with the same nonce, higher fee.
    theirs = chain.spend_nonce(payer, auth["nonce"], gas_price=chain.w3.eth.gas_price * 20)
    chain.mine()
    assert chain.w3.eth.get_transaction_receipt(ours)["status"] == 0  # ours reverted
    assert chain.w3.eth.get_transaction_receipt(theirs)["status"] == 1
    assert chain.authorization_used(payer.address, auth["nonce"])

    op = services.operation_reconcile(
        operation_id=PaymentOperation.objects.get(purchase_id=purchase["id"]).id, actor="test"
    )
    replay = _send(agent, purchase, header)
    settle_outbox()

    assert (op.outcome, op.reason) == ("failed", "authorization_used_elsewhere")
    assert replay.status_code == 402, replay.content
    assert chain.transfers(payer.address) == 0
    assert not chain.paid_in(ours, payer.address, PRICE_ATOMIC)
    assert not chain.paid_in(theirs, payer.address, PRICE_ATOMIC)
    _nothing_was_earned(purchase, requester)


def test_a_genuine_payment_is_confirmed_by_its_transfer_log(agent, report, chain):
    purchase, payer, header, _auth = _signed(agent, report, chain)
    chain.automine(False)
    _send(agent, purchase, header)
    chain.mine()

    op = services.operation_reconcile(
        operation_id=PaymentOperation.objects.get(purchase_id=purchase["id"]).id, actor="test"
    )

    tx = X402Authorization.objects.get(operation=op).transaction_hash
    assert op.outcome == "succeeded" and op.provider_reference == tx
    assert chain.paid_in(tx, payer.address, PRICE_ATOMIC)


def test_the_per_operation_judge_tells_a_payment_from_a_nonce_spent_elsewhere(agent, report, chain):
    """tests.x402.chain.Chain.operation_paid: the lifecycle machine's and the soak's judge."""
    paid_purchase, payer, header, _auth = _signed(agent, report, chain)
    _send(agent, paid_purchase, header)
    cheated, cheater, cheat_header, cheat_auth = _signed(agent, report, chain)
    chain.automine(False)
    _send(agent, cheated, cheat_header)
    chain.spend_nonce(
        cheater,
        cheat_auth["nonce"],
        to=chain.pay_to,
        value=1,
        gas_price=chain.w3.eth.gas_price * 20,
    )
    chain.mine()

    good = X402Authorization.objects.get(operation__purchase_id=paid_purchase["id"])
    bad = X402Authorization.objects.get(operation__purchase_id=cheated["id"])
    assert chain.operation_paid(good) is True
    assert chain.operation_paid(bad) is False
    assert chain.authorization_used(cheater.address, cheat_auth["nonce"])  # used, not paid
