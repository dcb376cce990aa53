"""Two x402 refunds signed at the same moment race for the refund signer's nonce. The
node refuses the later broadcast ("nonce too low" once the other is mined, "replacement
transaction underpriced" while it is pending): that refund is signed again with a fresh
nonce, its stored hash replaced, and both refunds move their money — on the real chain.

The race is made deterministic without faking the chain: the signer's nonce is read for
refund 1, then — before refund 1 broadcasts — refund 2 is dispatched by another worker
process (a real second Verity process on the same database and chain), or another
transaction of the signer takes the nonce. The chain itself refuses the stale one. And a
broadcast the node took whose answer was lost is never taken for a refusal and signed again."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from urllib.parse import urlparse

import pytest
from django.conf import settings as django_settings
from eth_account import Account

from payments import services
from payments.models import PaymentOperation, ProviderCall, X402RefundTransfer
from bench.fault_proxy import FaultProxy
from payments.providers.x402 import (
    REFUND_NONCE_ATTEMPTS,
    RefundSender,
    SettleKind,
    get_refund_sender,
)
from tests.conftest import ROOT
from tests.x402.conftest import SIGNATURE, settle_outbox, sign

pytestmark = pytest.mark.django_db(transaction=True)

PRICE_ATOMIC = 1250 * 10**4  # the report's 12.50 USD in USDC's 6 decimals
FUNDS = 1_000 * 10**6

# What a second gunicorn/celery process does with an approved refund: dispatch it.
_OTHER_WORKER = ("import sys, django; django.setup(); from payments import services; "
                 "print(services.operation_dispatch(operation_id=sys.argv[1]).outcome)")


@pytest.fixture
def people(django_user_model):
    return (django_user_model.objects.create(username="support-req"),
            django_user_model.objects.create(username="finance-ok"))


def _pay(agent, report, payer) -> dict:
    purchase = agent.new_purchase(report.sku)
    required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    header, _auth = sign(required, payer)
    r = agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})
    assert r.status_code in (200, 202), r.content
    charge = PaymentOperation.objects.get(purchase_id=purchase["id"], kind="charge")
    assert (charge.rail, charge.outcome) == ("x402", "succeeded")
    return purchase


def _approved_refund(purchase, people) -> PaymentOperation:
    requester, approver = people
    refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    return PaymentOperation.objects.get(id=refund.id)


def _two_approved_refunds(agent, report, chain, people):
    """One payer who bought two reports, a refund of each approved; the refund signer and
    its nonce before either is sent."""
    payer = chain.new_payer(FUNDS)
    first, second = _pay(agent, report, payer), _pay(agent, report, payer)
    refund_1, refund_2 = _approved_refund(first, people), _approved_refund(second, people)
    sender = get_refund_sender()
    return payer, refund_1, refund_2, sender, chain.w3.eth.get_transaction_count(sender.address)


def _dispatch_in_another_process(op: PaymentOperation, **env) -> str:
    db = django_settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"  # the test db
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_WORKER, op.id], cwd=ROOT, capture_output=True,
        text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": url,
             **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def _race_after_the_nonce_read(monkeypatch, sender, competitor, times: int = 1) -> list[int]:
    """The signer's pending nonce is read for real; then, before the caller signs and
    broadcasts with it, `competitor` runs (another process's refund, another transaction
    of the signer) — `times` times. Returns the nonces handed out."""
    eth = sender.w3.eth
    real = eth.get_transaction_count
    seen: list[int] = []

    def read_then_lose_the_race(address, block_identifier=None):
        nonce = real(address) if block_identifier is None else real(address, block_identifier)
        if block_identifier == "pending" and len(seen) < times:
            seen.append(nonce)
            competitor()
        return nonce

    monkeypatch.setattr(eth, "get_transaction_count", read_then_lose_the_race)
    return seen


def _sends(op) -> int:
    return ProviderCall.objects.filter(operation=op, purpose="dispatch", step="refund").count()


def _mined_nonce(chain, tx_hash: str) -> int:
    receipt = chain.w3.eth.get_transaction_receipt(tx_hash)
    assert receipt["status"] == 1
    return int(chain.w3.eth.get_transaction(tx_hash)["nonce"])


def test_two_refunds_racing_for_the_nonce_both_move_their_money(
        agent, report, chain, people, monkeypatch):
    # given one payer who bought two reports, and a refund of each approved
    payer, refund_1, refund_2, sender, signer_nonce = _two_approved_refunds(
        agent, report, chain, people)
    assert chain.balance(payer.address) == FUNDS - 2 * PRICE_ATOMIC
    outcome_2 = []
    # and refund 2 dispatched by another worker process right after refund 1 read the
    # signer's nonce: it signs the same nonce, broadcasts first and is mined
    seen = _race_after_the_nonce_read(
        monkeypatch, sender, lambda: outcome_2.append(_dispatch_in_another_process(refund_2)))

    # when refund 1 is dispatched
    done_1 = services.operation_dispatch(operation_id=refund_1.id)
    settle_outbox()

    # then the chain refused refund 1's first transaction (its nonce was taken), refund 1
    # was signed again with the next nonce, and both refunds succeeded
    assert seen == [signer_nonce] and outcome_2 == ["succeeded"]
    assert (done_1.outcome, done_1.verification) == ("succeeded", "provider"), done_1.reason
    assert PaymentOperation.objects.get(id=refund_2.id).outcome == "succeeded"
    assert chain.balance(payer.address) == FUNDS  # rose by both amounts
    assert chain.transfers_back(payer.address) == 2  # exactly two Transfer logs back
    assert chain.w3.eth.get_transaction_count(sender.address) == signer_nonce + 2
    row_1 = X402RefundTransfer.objects.get(operation=refund_1)
    row_2 = X402RefundTransfer.objects.get(operation=refund_2)
    # the rows hold the hashes that were mined, with the nonces they were mined with
    assert (row_2.chain_nonce, _mined_nonce(chain, row_2.transaction_hash)) == \
        (signer_nonce, signer_nonce)
    assert (row_1.chain_nonce, _mined_nonce(chain, row_1.transaction_hash)) == \
        (signer_nonce + 1, signer_nonce + 1)
    assert row_1.block_number and row_2.block_number
    assert _sends(refund_1) == 1 and _sends(refund_2) == 1
    call_1 = ProviderCall.objects.get(operation=refund_1, purpose="dispatch", step="refund")
    assert call_1.safe_fields["transaction"] == row_1.transaction_hash
    assert f"nonce {signer_nonce} taken" in call_1.safe_fields["detail"]
    # and the read-back of refund 1 finds its transfer, and sends nothing
    seen_1 = services.operation_read_canonical(operation_id=refund_1.id)
    assert (seen_1.status, seen_1.id) == ("confirmed", row_1.transaction_hash)
    assert chain.transfers_back(payer.address) == 2


def test_a_nonce_held_by_a_pending_transaction_is_signed_again_and_both_are_mined(
        agent, report, chain, people, monkeypatch):
    # given two approved refunds to one payer and a chain that mines only when told
    payer, refund_1, refund_2, sender, signer_nonce = _two_approved_refunds(
        agent, report, chain, people)
    chain.automine(False)
    outcome_2 = []
    # and refund 2, from another process, broadcast after refund 1 read the nonce: it is
    # pending with that nonce (at the same gas price) when refund 1 broadcasts
    seen = _race_after_the_nonce_read(
        monkeypatch, sender, lambda: outcome_2.append(_dispatch_in_another_process(
            refund_2, X402_REFUND_RECEIPT_TIMEOUT="0.5")))

    # when refund 1 is dispatched ("replacement transaction underpriced" for its first
    # transaction), then the block is mined and both are read back
    waiting_1 = services.operation_dispatch(operation_id=refund_1.id)
    pending = chain.pending()
    chain.mine()
    read_1 = services.operation_reconcile(operation_id=refund_1.id, actor="test")
    read_2 = services.operation_reconcile(operation_id=refund_2.id, actor="test")
    settle_outbox()

    # then both were in the mempool at once, with two nonces, and both moved their money
    assert seen == [signer_nonce] and outcome_2 == ["awaiting_provider"]
    assert waiting_1.outcome == "awaiting_provider"
    row_1 = X402RefundTransfer.objects.get(operation=refund_1)
    row_2 = X402RefundTransfer.objects.get(operation=refund_2)
    assert sorted(pending) == sorted([row_1.transaction_hash, row_2.transaction_hash])
    assert (read_1.outcome, read_2.outcome) == ("succeeded", "succeeded")
    assert (row_2.chain_nonce, _mined_nonce(chain, row_2.transaction_hash)) == \
        (signer_nonce, signer_nonce)
    assert (row_1.chain_nonce, _mined_nonce(chain, row_1.transaction_hash)) == \
        (signer_nonce + 1, signer_nonce + 1)
    assert chain.balance(payer.address) == FUNDS
    assert chain.transfers_back(payer.address) == 2
    assert _sends(refund_1) == 1 and _sends(refund_2) == 1
    call_1 = ProviderCall.objects.get(operation=refund_1, purpose="dispatch", step="refund")
    assert f"nonce {signer_nonce} taken" in call_1.safe_fields["detail"]


def test_a_nonce_taken_at_every_sign_gives_up_after_the_bound_and_moves_nothing(
        agent, report, chain, people, monkeypatch):
    # given an approved refund, and another transaction of the refund signer taking its
    # nonce after every read (a stuck fleet of workers, an operator's manual send)
    payer = chain.new_payer(FUNDS)
    refund = _approved_refund(_pay(agent, report, payer), people)
    sender = get_refund_sender()
    signer = Account.from_key(os.environ["X402_REFUND_PRIVATE_KEY"])
    signer_nonce = chain.w3.eth.get_transaction_count(sender.address)

    def another_transaction_of_the_signer():
        w3 = chain.w3
        tx = {"to": signer.address, "value": 0, "gas": 30_000, "gasPrice": w3.eth.gas_price,
              "nonce": w3.eth.get_transaction_count(signer.address, "pending"),
              "chainId": w3.eth.chain_id}
        w3.eth.send_raw_transaction(signer.sign_transaction(tx).raw_transaction)

    seen = _race_after_the_nonce_read(monkeypatch, sender, another_transaction_of_the_signer,
                                      times=REFUND_NONCE_ATTEMPTS + 1)

    # when the refund is dispatched
    lost = services.operation_dispatch(operation_id=refund.id)

    # then it signed a bounded number of times and ended as before the fix: unknown with
    # the last refused hash stored, and failed once the chain proves that nonce is taken
    assert seen == [signer_nonce + i for i in range(REFUND_NONCE_ATTEMPTS)]
    assert lost.outcome == "unknown"
    row = X402RefundTransfer.objects.get(operation=refund)
    assert row.chain_nonce == signer_nonce + REFUND_NONCE_ATTEMPTS - 1
    assert row.transaction_hash and row.block_number is None
    call = ProviderCall.objects.get(operation=refund, purpose="dispatch", step="refund")
    assert "nonce too low" in call.safe_fields["detail"]
    proven = services.operation_reconcile(operation_id=refund.id, actor="test")
    settle_outbox()
    assert (proven.outcome, proven.reason) == ("failed", "provider_failed")
    assert chain.transfers_back(payer.address) == 0
    assert chain.balance(payer.address) == FUNDS - PRICE_ATOMIC
    assert chain.w3.eth.get_transaction_count(sender.address) == \
        signer_nonce + REFUND_NONCE_ATTEMPTS  # only the competing transactions were mined
    assert _sends(refund) == 1


def test_a_refusal_that_is_not_about_the_nonce_is_not_signed_again(
        agent, report, chain, people, monkeypatch):
    # given an approved refund and a refund signer with no ether left for gas
    payer = chain.new_payer(FUNDS)
    refund = _approved_refund(_pay(agent, report, payer), people)
    sender = get_refund_sender()
    signer_nonce = chain.w3.eth.get_transaction_count(sender.address)
    ether = chain.w3.eth.get_balance(sender.address)
    seen = _race_after_the_nonce_read(monkeypatch, sender, lambda: None, times=10)
    chain.rpc("anvil_setBalance", [sender.address, "0x0"])
    try:
        # when the refund is dispatched
        refused = services.operation_dispatch(operation_id=refund.id)
    finally:
        chain.rpc("anvil_setBalance", [sender.address, hex(ether)])

    # then the node's refusal ("Insufficient funds ...") is today's unknown after one
    # sign: the nonce is still free, so the receipt read gives no verdict
    assert seen == [signer_nonce]
    assert refused.outcome == "unknown"
    row = X402RefundTransfer.objects.get(operation=refund)
    assert row.chain_nonce == signer_nonce and row.transaction_hash
    call = ProviderCall.objects.get(operation=refund, purpose="dispatch", step="refund")
    assert "insufficient funds" in call.safe_fields["detail"].lower()
    still = services.operation_reconcile(operation_id=refund.id, actor="test")
    settle_outbox()
    assert still.outcome == "unknown"
    assert chain.transfers_back(payer.address) == 0
    assert chain.w3.eth.get_transaction_count(sender.address) == signer_nonce
    assert _sends(refund) == 1


def test_an_answer_lost_after_the_node_took_the_transfer_is_never_signed_again(chain):
    # given the refund signer (holding twice the amount: a second transfer could move)
    # talking to the chain through a proxy that holds the answer to its broadcast past
    # the client's 10-s timeout (the node took the transfer and mined it)
    proxy = FaultProxy(urlparse(os.environ["X402_RPC_URL"]).port)
    proxy.up()
    payer = chain.new_payer(FUNDS)
    chain.token.functions.mint(chain.pay_to, 2 * PRICE_ATOMIC).transact({"from": chain.admin})
    sender = RefundSender(rpc_url=proxy.base, asset=os.environ["X402_ASSET"],
                          private_key=os.environ["X402_REFUND_PRIVATE_KEY"], receipt_timeout=5)
    signer_nonce = chain.w3.eth.get_transaction_count(sender.address)
    stored: list[tuple[str, int]] = []

    def on_signed(tx_hash: str, nonce: int) -> None:
        stored.append((tx_hash, nonce))
        if len(stored) == 1:  # only this broadcast's answer is held; a re-post would pass
            proxy.hold(10.5)
            threading.Timer(1.0, proxy.hold, args=(0,)).start()

    try:
        # when the refund transfer is sent
        answer = sender.send(to=payer.address, value=PRICE_ATOMIC, on_signed=on_signed)
    finally:
        proxy.down()

    # then the timeout is an unknown answer on the one stored hash: the broadcast was not
    # re-posted (web3's default would be, and the node's "nonce too low" for our own
    # mined transfer would look like a taken nonce), nothing was signed again, and exactly
    # one transfer moved
    assert answer.kind == SettleKind.UNKNOWN and "timeout" in answer.detail, answer
    assert stored == [(answer.transaction, signer_nonce)]
    assert _mined_nonce(chain, answer.transaction) == signer_nonce
    assert chain.transfers_back(payer.address) == 1
    assert chain.balance(payer.address) == FUNDS + PRICE_ATOMIC
    assert chain.w3.eth.get_transaction_count(sender.address) == signer_nonce + 1
