"""Two x402 refunds dispatched at the same moment in two processes take the refund
signer's nonces in turn (one nonce allocator for the signer across processes: a PostgreSQL
advisory lock around nonce read -> sign -> persist -> broadcast): neither refuses nor
replaces the other at its nonce, and both move their money — on the real chain. Another
transaction of the signer (made outside Verity) can still take a refund's nonce: the node
refuses that refund ("nonce too low" once the other is mined, "replacement transaction
underpriced" while it is pending) and it is signed again with a fresh nonce.

The race is made deterministic without faking the chain: the signer's nonce is read for
refund 1, then — before refund 1 broadcasts — refund 2 is dispatched by another worker
process (a real second Verity process on the same database and chain), or another
transaction of the signer takes the nonce. The chain itself refuses a stale nonce. And a
broadcast the node took whose answer was lost is never taken for a refusal and signed again."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from urllib.parse import urlparse

import pytest
from django.conf import settings as django_settings
from django.db import OperationalError, connection
from django.utils import timezone
from eth_account import Account

from bench.fault_proxy import FaultProxy
from payments import services
from payments.locks import signer_lock, signer_lock_key
from payments.models import PaymentOperation, ProviderCall, X402RefundTransfer
from payments.providers.x402 import (
    REFUND_NONCE_ATTEMPTS,
    RefundSender,
    SettleKind,
    get_refund_sender,
)
from recovery.models import OutboxMessage
from tests.outbox import settle_outbox
from tests.stack import ROOT
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)

PRICE_ATOMIC = 1250 * 10**4  # the report's 12.50 USD in USDC's 6 decimals
FUNDS = 1_000 * 10**6

# What a second gunicorn/celery process does with an approved refund: dispatch it.
_OTHER_WORKER = (
    "import sys, django; django.setup(); from payments import services; "
    "print(services.operation_dispatch(operation_id=sys.argv[1]).outcome)"
)


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
    _, requester, approver = people
    refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    return PaymentOperation.objects.get(id=refund.id)


def _two_approved_refunds(agent, report, chain, people):
    """One payer who bought two reports, a refund of each approved; the refund signer and
    its nonce before either is sent."""
    payer = chain.new_payer(FUNDS)
    first, second = _pay(agent, report, payer), _pay(agent, report, payer)
    refund_1, refund_2 = _approved_refund(first, people), _approved_refund(second, people)
    # The test is each refund's dispatcher: their dispatch backstops (due 35 s after the
    # approval, for a dispatcher that died) must not send them first on a slow machine,
    # or the race below never happens (seen once in CI under load: no nonce read hooked).
    OutboxMessage.objects.filter(
        dedupe_key__in=[f"dispatch-backstop:{r.id}" for r in (refund_1, refund_2)],
        processed_at__isnull=True,
    ).update(available_at=timezone.now() + timedelta(hours=1))
    sender = get_refund_sender()
    return payer, refund_1, refund_2, sender, chain.w3.eth.get_transaction_count(sender.address)


def _start_in_another_process(op: PaymentOperation, **env) -> subprocess.Popen:
    db = django_settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"  # the test db
    return subprocess.Popen(
        [sys.executable, "-c", _OTHER_WORKER, op.id],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": url, **env},
    )


def _outcome_of(worker: subprocess.Popen) -> str:
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err[-2000:]
    return out.strip().splitlines()[-1]


def _signer_lock_now(address: str) -> tuple[int, int]:
    """(held by this session, sessions waiting for it): the signer's advisory lock in
    pg_locks (a bigint key shows as classid = high 32 bits, objid = low 32, objsubid 1)."""
    key = signer_lock_key(address)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE granted AND pid = pg_backend_pid()),"
            "       count(*) FILTER (WHERE NOT granted AND pid <> pg_backend_pid())"
            "  FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            "   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            "   AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
            [(key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF],
        )
        return cur.fetchone()


def _another_process_dispatches_meanwhile(chain, sender, op, signer_nonce: int, seen: dict, **env):
    """A competitor for the race hook: start `op`'s dispatch in another worker process and
    watch it until it waits for the signer's lock, broadcasts or exits (at most 60 s),
    then half a second more. What was seen goes into `seen` (asserting here would only
    make the hooked nonce read fail)."""

    def competitor() -> None:
        try:
            worker = _start_in_another_process(op, **env)
            seen["started"] = worker
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                held, waiting = _signer_lock_now(sender.address)
                if (
                    waiting
                    or worker.poll() is not None
                    or signer_nonce != chain.w3.eth.get_transaction_count(sender.address, "pending")
                ):
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            seen.update(
                worker=worker,
                held=held,
                waiting=waiting,
                running=worker.poll() is None,
                pending_nonce=chain.w3.eth.get_transaction_count(sender.address, "pending"),
            )
        except BaseException as exc:
            seen["error"] = repr(exc)  # said by _competitor_seen, not lost in the dispatch
            raise

    return competitor


def _competitor_seen(other: dict, op: PaymentOperation) -> subprocess.Popen:
    """The competitor's process, or a failure that says why it never ran or broke off
    (with what the hooked dispatch of `op` recorded)."""
    if "worker" not in other:
        started = other.get("started")
        if started is not None:
            started.kill()
        calls = list(
            ProviderCall.objects.filter(operation=op).values(
                "step", "classification", "safe_fields"
            )
        )
        pytest.fail(
            f"the competitor did not run to the end: {other.get('error', 'no nonce read')}"
            f"; {op.id} is {PaymentOperation.objects.get(id=op.id).outcome}, calls {calls}"
        )
    return other["worker"]


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


def _another_transaction_of_the_signer(chain):
    """A competitor for the race hook: a 0-value transaction of the refund signer sent
    straight to the node (an operator's manual send, a tool outside Verity)."""
    signer = Account.from_key(os.environ["X402_REFUND_PRIVATE_KEY"])

    def send() -> None:
        w3 = chain.w3
        tx = {
            "to": signer.address,
            "value": 0,
            "gas": 30_000,
            "gasPrice": w3.eth.gas_price,
            "nonce": w3.eth.get_transaction_count(signer.address, "pending"),
            "chainId": w3.eth.chain_id,
        }
        w3.eth.send_raw_transaction(signer.sign_transaction(tx).raw_transaction)

    return send


def _sends(op) -> int:
    return ProviderCall.objects.filter(operation=op, purpose="dispatch", step="refund").count()


def _refund_call(op) -> ProviderCall:
    return ProviderCall.objects.get(operation=op, purpose="dispatch", step="refund")


def _mined_nonce(chain, tx_hash: str) -> int:
    receipt = chain.w3.eth.get_transaction_receipt(tx_hash)
    assert receipt["status"] == 1
    return int(chain.w3.eth.get_transaction(tx_hash)["nonce"])


def test_two_refunds_at_once_in_two_processes_take_the_signers_nonces_in_turn(
    agent, report, chain, people, monkeypatch
):
    # given one payer who bought two reports, and a refund of each approved
    payer, refund_1, refund_2, sender, signer_nonce = _two_approved_refunds(
        agent, report, chain, people
    )
    assert chain.balance(payer.address) == FUNDS - 2 * PRICE_ATOMIC
    other: dict = {}
    # and refund 2 dispatched by another worker process right after refund 1 read the
    # signer's nonce (before refund 1 signs and broadcasts with it)
    seen = _race_after_the_nonce_read(
        monkeypatch,
        sender,
        _another_process_dispatches_meanwhile(chain, sender, refund_2, signer_nonce, other),
    )

    # when refund 1 is dispatched
    done_1 = services.operation_dispatch(operation_id=refund_1.id)
    outcome_2 = _outcome_of(_competitor_seen(other, refund_1))
    settle_outbox()

    # then the other process waited for the signer's lock, which refund 1 held, and
    # broadcast nothing meanwhile
    assert seen == [signer_nonce]
    assert (other["held"], other["waiting"], other["running"], other["pending_nonce"]) == (
        1,
        1,
        True,
        signer_nonce,
    )
    # and both refunds succeeded, with nonces n and n + 1, each signed once
    assert (done_1.outcome, done_1.verification) == ("succeeded", "provider"), done_1.reason
    assert outcome_2 == "succeeded"
    assert PaymentOperation.objects.get(id=refund_2.id).outcome == "succeeded"
    assert chain.balance(payer.address) == FUNDS  # rose by both amounts
    assert chain.transfers_back(payer.address) == 2  # exactly two Transfer logs back
    assert chain.w3.eth.get_transaction_count(sender.address) == signer_nonce + 2
    row_1 = X402RefundTransfer.objects.get(operation=refund_1)
    row_2 = X402RefundTransfer.objects.get(operation=refund_2)
    assert (row_1.chain_nonce, _mined_nonce(chain, row_1.transaction_hash)) == (
        signer_nonce,
        signer_nonce,
    )
    assert (row_2.chain_nonce, _mined_nonce(chain, row_2.transaction_hash)) == (
        signer_nonce + 1,
        signer_nonce + 1,
    )
    assert row_1.block_number and row_2.block_number
    assert _sends(refund_1) == 1 and _sends(refund_2) == 1
    # (a send's detail is empty only when its first sign was accepted: no refusal)
    for refund, row in ((refund_1, row_1), (refund_2, row_2)):
        call = _refund_call(refund)
        assert (call.safe_fields["transaction"], call.safe_fields["detail"]) == (
            row.transaction_hash,
            "",
        )
    # and the read-back of refund 1 finds its transfer, and sends nothing
    seen_1 = services.operation_read_canonical(operation_id=refund_1.id)
    assert (seen_1.status, seen_1.id) == ("confirmed", row_1.transaction_hash)
    assert chain.transfers_back(payer.address) == 2


def test_a_refund_pending_at_a_nonce_is_never_signed_over_by_another_process(
    agent, report, chain, people, monkeypatch
):
    # given two approved refunds to one payer and a chain that mines only when told
    payer, refund_1, refund_2, sender, signer_nonce = _two_approved_refunds(
        agent, report, chain, people
    )
    chain.automine(False)
    other: dict = {}
    # and refund 2 dispatched by another process right after refund 1 read the nonce
    seen = _race_after_the_nonce_read(
        monkeypatch,
        sender,
        _another_process_dispatches_meanwhile(
            chain, sender, refund_2, signer_nonce, other, X402_REFUND_RECEIPT_TIMEOUT="0.5"
        ),
    )

    # when refund 1 is dispatched (its transfer stays pending), then the block is mined
    # and both are read back
    waiting_1 = services.operation_dispatch(operation_id=refund_1.id)
    outcome_2 = _outcome_of(_competitor_seen(other, refund_1))
    pending = chain.pending()
    chain.mine()
    read_1 = services.operation_reconcile(operation_id=refund_1.id, actor="test")
    read_2 = services.operation_reconcile(operation_id=refund_2.id, actor="test")
    settle_outbox()

    # then the other process waited for the lock and signed only after refund 1's
    # transfer was pending: the next nonce (it can neither replace nor be refused by it,
    # whatever its gas price), and both moved their money
    assert seen == [signer_nonce]
    assert (other["held"], other["waiting"], other["running"], other["pending_nonce"]) == (
        1,
        1,
        True,
        signer_nonce,
    )
    assert (waiting_1.outcome, outcome_2) == ("awaiting_provider", "awaiting_provider")
    row_1 = X402RefundTransfer.objects.get(operation=refund_1)
    row_2 = X402RefundTransfer.objects.get(operation=refund_2)
    assert sorted(pending) == sorted([row_1.transaction_hash, row_2.transaction_hash])
    assert (read_1.outcome, read_2.outcome) == ("succeeded", "succeeded")
    assert (row_1.chain_nonce, _mined_nonce(chain, row_1.transaction_hash)) == (
        signer_nonce,
        signer_nonce,
    )
    assert (row_2.chain_nonce, _mined_nonce(chain, row_2.transaction_hash)) == (
        signer_nonce + 1,
        signer_nonce + 1,
    )
    assert chain.balance(payer.address) == FUNDS
    assert chain.transfers_back(payer.address) == 2
    assert _sends(refund_1) == 1 and _sends(refund_2) == 1
    assert "taken" not in _refund_call(refund_1).safe_fields["detail"]
    assert "taken" not in _refund_call(refund_2).safe_fields["detail"]


def test_a_nonce_held_by_a_pending_transaction_of_the_signer_is_signed_again(
    agent, report, chain, people, monkeypatch
):
    # given an approved refund, a chain that mines only when told, and another
    # transaction of the refund signer sent straight to the node right after the refund
    # read its nonce: pending with that nonce, at the same gas price
    payer = chain.new_payer(FUNDS)
    refund = _approved_refund(_pay(agent, report, payer), people)
    sender = get_refund_sender()
    signer_nonce = chain.w3.eth.get_transaction_count(sender.address)
    chain.automine(False)
    seen = _race_after_the_nonce_read(
        monkeypatch, sender, _another_transaction_of_the_signer(chain)
    )

    # when the refund is dispatched ("replacement transaction underpriced" for its first
    # transaction), then the block is mined and the refund read back
    waiting = services.operation_dispatch(operation_id=refund.id)
    pending = chain.pending()
    chain.mine()
    read = services.operation_reconcile(operation_id=refund.id, actor="test")
    settle_outbox()

    # then the refund was signed again with the next nonce, and moved its money once
    assert seen == [signer_nonce] and waiting.outcome == "awaiting_provider"
    row = X402RefundTransfer.objects.get(operation=refund)
    assert len(pending) == 2 and row.transaction_hash in pending
    assert read.outcome == "succeeded"
    assert (row.chain_nonce, _mined_nonce(chain, row.transaction_hash)) == (
        signer_nonce + 1,
        signer_nonce + 1,
    )
    assert chain.balance(payer.address) == FUNDS
    assert chain.transfers_back(payer.address) == 1
    assert _sends(refund) == 1
    assert f"nonce {signer_nonce} taken" in _refund_call(refund).safe_fields["detail"]


def test_a_nonce_taken_at_every_sign_gives_up_after_the_bound_and_moves_nothing(
    agent, report, chain, people, monkeypatch
):
    # given an approved refund, and another transaction of the refund signer taking its
    # nonce after every read (a stuck fleet of workers, an operator's manual send)
    payer = chain.new_payer(FUNDS)
    refund = _approved_refund(_pay(agent, report, payer), people)
    sender = get_refund_sender()
    signer_nonce = chain.w3.eth.get_transaction_count(sender.address)
    seen = _race_after_the_nonce_read(
        monkeypatch,
        sender,
        _another_transaction_of_the_signer(chain),
        times=REFUND_NONCE_ATTEMPTS + 1,
    )

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
    assert (
        chain.w3.eth.get_transaction_count(sender.address) == signer_nonce + REFUND_NONCE_ATTEMPTS
    )  # only the competing transactions were mined
    assert _sends(refund) == 1


def test_a_refusal_that_is_not_about_the_nonce_is_not_signed_again(
    agent, report, chain, people, monkeypatch
):
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
    chain.token.functions.mint(chain.refund_account, 2 * PRICE_ATOMIC).transact(
        {"from": chain.admin}
    )
    sender = RefundSender(
        rpc_url=proxy.base,
        asset=os.environ["X402_ASSET"],
        private_key=os.environ["X402_REFUND_PRIVATE_KEY"],
        receipt_timeout=5,
    )
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


def test_a_connection_lost_while_holding_the_signer_lock_neither_raises_nor_keeps_it():
    # given the signer's lock held by this session
    address = Account.create().address
    with signer_lock(address):
        assert _signer_lock_now(address) == (1, 0)
        # when the session is lost inside the block (a database restart, a killed backend)
        with pytest.raises(OperationalError), connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    # then leaving the block did not raise over the block's own answer, and the lock is
    # free for the next session (its end released it)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [signer_lock_key(address)])
        assert cur.fetchone() == (True,)
        cur.execute("SELECT pg_advisory_unlock(%s)", [signer_lock_key(address)])
