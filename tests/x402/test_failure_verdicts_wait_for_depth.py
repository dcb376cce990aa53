"""A "never paid" verdict (cancelled, expired, a facilitator's refusal) is final only when
the chain, read at X402_CONFIRMATIONS, shows the authorization can no longer be used:
until then the charge stays open and is read again. Re-orgs (anvil_reorg), roll-backs
(evm_snapshot / evm_revert) and a facilitator that broadcasts the transfer but answers a
refusal, on anvil with FiatTokenV2_2. Judged from raw Transfer logs and DB rows."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from web3 import Web3

from payments import services
from payments.models import PaymentOperation, X402Authorization
from payments.providers.x402 import decode_header
from recovery.reconciler import reconcile_due
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)

PRICE_ATOMIC = 1250 * 10**4
TWA = (
    "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,"
    "uint8,bytes32,bytes32)"
)


# -- the buyer's and the chain's side (raw reads, nothing of Verity's proof code) --------
def _send(agent, purchase, header):
    return agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})


def _signed(agent, purchase, payer) -> tuple[str, dict, str]:
    required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    header, auth = sign(required, payer)
    return header, auth, decode_header(header)["payload"]["signature"]


def _pay_again(agent, purchase, payer):
    """The buyer tries to pay again: a new authorization, if Verity asks for one at all.
    Returns the answer (to the new authorization, or to the GET that asked for none)."""
    asked = agent.get(f"purchases/{purchase['id']}/deliverable")
    if "PAYMENT-REQUIRED" not in asked.headers:
        return asked
    header, _auth = sign(asked.headers["PAYMENT-REQUIRED"], payer)
    return _send(agent, purchase, header)


def _submit(chain, auth: dict, signature: str) -> str:
    """Anyone (here: the facilitator that kept it) sends a signed authorization itself."""
    sig = bytes.fromhex(signature[2:])
    fn = chain.token.get_function_by_signature(TWA)
    return Web3.to_hex(
        fn(
            Web3.to_checksum_address(auth["from"]),
            Web3.to_checksum_address(auth["to"]),
            int(auth["value"]),
            int(auth["validAfter"]),
            int(auth["validBefore"]),
            bytes.fromhex(auth["nonce"][2:]),
            sig[64],
            sig[:32],
            sig[32:64],
        ).transact({"from": chain.admin})
    )


def _charges(purchase) -> list[PaymentOperation]:
    return list(
        PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="charge").order_by(
            "created_at"
        )
    )


def _first(purchase) -> PaymentOperation:
    return _charges(purchase)[0]


def _counted(payer: str) -> int:
    """What Verity counts as received from `payer`: its succeeded x402 charges' values."""
    return sum(
        int(a.value)
        for a in X402Authorization.objects.filter(payer=payer, operation__outcome="succeeded")
    )


def _read_open(purchase) -> None:
    reconcile_due()
    for op in _charges(purchase):
        if op.outcome in ("awaiting_provider", "unknown"):
            services.operation_reconcile(operation_id=op.id, actor="test")
    settle_outbox()


def _open(op: PaymentOperation) -> bool:
    return op.outcome in ("awaiting_provider", "unknown")


# -- cancelled / expired: decided at the confirmation depth -------------------------------
def test_a_cancel_shallower_than_the_confirmations_is_no_verdict_and_a_reorg_keeps_it_paid(
    agent, report, chain, settings
):
    settings.X402_CONFIRMATIONS = 3
    payer = chain.new_payer()
    purchase = agent.new_purchase(report.sku)
    header, auth, signature = _signed(agent, purchase, payer)
    chain.automine(False)
    r = _send(agent, purchase, header)
    assert r.status_code == 202 and r.json()["code"] == "settlement_pending", r.content
    chain.cancel_authorization(payer, auth["nonce"], gas_price=chain.w3.eth.gas_price * 20)
    chain.mine()
    op = services.operation_reconcile(operation_id=_first(purchase).id, actor="test")
    assert _open(op), (op.outcome, op.reason)  # the cancel is 1 confirmation of 3

    chain.reorg(1)  # the cancel's block is replaced: the authorization is usable again
    chain.automine(True)
    chain.refill_facilitator_nonce()
    assert not chain.authorization_used(payer.address, auth["nonce"])
    _submit(chain, auth, signature)
    chain.mine(5)
    # The buyer was never told "not paid": a new authorization is not taken.
    assert _pay_again(agent, purchase, payer).status_code in (200, 202, 409)
    chain.mine(3)
    _read_open(purchase)

    received, counted = chain.received_from(payer.address), _counted(payer.address)
    assert received == counted == PRICE_ATOMIC, (received, counted)
    first = _first(purchase)
    assert first.outcome == "succeeded", (first.outcome, first.reason)
    assert len(_charges(purchase)) == 1


def test_a_cancel_as_deep_as_the_confirmations_fails_the_charge(agent, report, chain, settings):
    settings.X402_CONFIRMATIONS = 3
    payer = chain.new_payer()
    purchase = agent.new_purchase(report.sku)
    header, auth, _signature = _signed(agent, purchase, payer)
    chain.automine(False)
    _send(agent, purchase, header)
    chain.cancel_authorization(payer, auth["nonce"], gas_price=chain.w3.eth.gas_price * 20)
    chain.mine(3)
    chain.automine(True)

    op = services.operation_reconcile(operation_id=_first(purchase).id, actor="test")
    assert (op.outcome, op.reason) == ("failed", "authorization_canceled")
    assert chain.received_from(payer.address) == 0 == _counted(payer.address)


def test_an_expiry_rolled_back_before_the_confirmations_leaves_the_charge_open(
    agent, report, chain, settings
):
    settings.X402_CONFIRMATIONS = 3
    settings.X402_MAX_TIMEOUT_SECONDS = 60
    payer = chain.new_payer()
    purchase = agent.new_purchase(report.sku)
    header, auth, signature = _signed(agent, purchase, payer)
    chain.automine(False)
    r = _send(agent, purchase, header)
    assert r.status_code == 202, r.content
    chain.drop(X402Authorization.objects.get(pk=_first(purchase).id).transaction_hash)
    chain.automine(True)
    chain.refill_facilitator_nonce()
    snapshot = chain.rpc("evm_snapshot")
    chain.expire(int(auth["validBefore"]))  # one block at validBefore: 1 confirmation of 3
    op = services.operation_reconcile(operation_id=_first(purchase).id, actor="test")
    assert _open(op), (op.outcome, op.reason)

    chain.rpc("evm_revert", [snapshot])  # that block is gone: the chain is before validBefore
    assert int(chain.w3.eth.get_block("latest")["timestamp"]) < int(auth["validBefore"])
    _submit(chain, auth, signature)
    chain.mine(5)
    _read_open(purchase)

    received, counted = chain.received_from(payer.address), _counted(payer.address)
    op.refresh_from_db()
    assert received == counted == PRICE_ATOMIC, (received, counted, op.outcome, op.reason)
    assert op.outcome == "succeeded"


def test_an_expiry_as_deep_as_the_confirmations_fails_the_charge(agent, report, chain, settings):
    settings.X402_CONFIRMATIONS = 3
    settings.X402_MAX_TIMEOUT_SECONDS = 60
    payer = chain.new_payer()
    purchase = agent.new_purchase(report.sku)
    header, auth, _signature = _signed(agent, purchase, payer)
    chain.automine(False)
    _send(agent, purchase, header)
    chain.drop(X402Authorization.objects.get(pk=_first(purchase).id).transaction_hash)
    chain.automine(True)
    chain.refill_facilitator_nonce()
    chain.expire(int(auth["validBefore"]))
    assert _open(services.operation_reconcile(operation_id=_first(purchase).id, actor="test"))
    chain.mine(2)  # the block at validBefore is now 3 deep

    op = services.operation_reconcile(operation_id=_first(purchase).id, actor="test")
    assert (op.outcome, op.reason) == ("failed", "authorization_expired")
    assert chain.received_from(payer.address) == 0 == _counted(payer.address)


# -- a facilitator's refusal is evidence only once the chain agrees -----------------------
class _Refuse(Exception):
    """before_settle raises it to answer its body without forwarding anything."""


def _facilitator_that_refuses(real: str, *, status: int = 200, forward: bool = True):
    """Passes /supported to the real facilitator. /settle: forwarded (the real facilitator
    broadcasts and mines the transfer) and then answered with a refusal, or (forward=False)
    refused without sending anything -- the signed authorization stays in its hands. The
    refusal: an invalid-signature verdict (200) or a refused credential (401/403)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            r = requests.get(f"{real}{self.path}", timeout=10)
            self._answer(r.status_code, r.json())

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path != "/settle":
                r = requests.post(f"{real}{self.path}", json=body, timeout=30)
                return self._answer(r.status_code, r.json())
            if forward:
                requests.post(f"{real}{self.path}", json=body, timeout=30)
            if status != 200:
                return self._answer(status, {"error": "unauthorized"})
            self._answer(
                200,
                {
                    "success": False,
                    "errorReason": "invalid_exact_evm_payload_signature",
                    "transaction": "",
                    "network": "eip155:31337",
                },
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _pay_through(agent, report, chain, settings, server):
    settings.X402_FACILITATOR_URL = f"http://127.0.0.1:{server.server_port}"
    try:
        payer = chain.new_payer()
        purchase = agent.new_purchase(report.sku)
        header, auth, signature = _signed(agent, purchase, payer)
        r = _send(agent, purchase, header)
    finally:
        server.shutdown()
        settings.X402_FACILITATOR_URL = chain.facilitator
    return payer, purchase, auth, signature, r


@pytest.mark.parametrize("status", [200, 401, 403])
def test_a_refusal_from_a_facilitator_that_sent_the_transfer_is_not_a_failure(
    agent, report, chain, settings, status
):
    payer, purchase, auth, _sig, r = _pay_through(
        agent, report, chain, settings, _facilitator_that_refuses(chain.facilitator, status=status)
    )
    first = _first(purchase)
    assert first.outcome != "failed", (r.status_code, r.content[:300])
    # The buyer tries again anyway, through the honest facilitator: not taken.
    r2 = _pay_again(agent, purchase, payer)
    _read_open(purchase)

    assert chain.authorization_used(payer.address, auth["nonce"])
    received, counted = chain.received_from(payer.address), _counted(payer.address)
    first.refresh_from_db()
    assert received == counted == PRICE_ATOMIC, (
        f"received {received}, Verity counts {counted}; first answer {r.status_code}, first "
        f"charge {first.outcome}/{first.reason}; retry {r2.status_code} {r2.content[:300]}"
    )
    assert first.outcome == "succeeded"
    assert len(_charges(purchase)) == 1


def test_a_refused_authorization_that_lands_later_is_counted(agent, report, chain, settings):
    """The facilitator refuses without sending, keeps the signed authorization and sends
    it later: the charge was left open (not "nothing was charged"), so the transfer is
    counted when it lands."""
    payer, purchase, auth, signature, r = _pay_through(
        agent, report, chain, settings, _facilitator_that_refuses(chain.facilitator, forward=False)
    )
    first = _first(purchase)
    assert first.outcome == "unknown", (first.outcome, first.reason)
    assert r.status_code == 202 and "nothing was charged" not in r.content.decode(), r.content
    assert not chain.authorization_used(payer.address, auth["nonce"])

    _submit(chain, auth, signature)
    chain.mine()
    _read_open(purchase)

    first.refresh_from_db()
    received, counted = chain.received_from(payer.address), _counted(payer.address)
    assert received == counted == PRICE_ATOMIC, (received, counted, first.outcome)
    assert first.outcome == "succeeded"


def test_a_refused_authorization_fails_once_expired_and_the_wallet_can_pay_again(
    agent, report, chain, settings
):
    """An honest refusal (nothing sent): failed once validBefore passed on chain, and then
    the same wallet signs a new authorization and pays."""
    settings.X402_MAX_TIMEOUT_SECONDS = 60
    payer, purchase, auth, _sig, _r = _pay_through(
        agent, report, chain, settings, _facilitator_that_refuses(chain.facilitator, forward=False)
    )
    assert _first(purchase).outcome == "unknown"

    chain.expire(int(auth["validBefore"]))
    op = services.operation_reconcile(operation_id=_first(purchase).id, actor="test")
    assert (op.outcome, op.reason) == ("failed", "authorization_expired")
    assert not chain.authorization_used(payer.address, auth["nonce"])

    settings.X402_MAX_TIMEOUT_SECONDS = 300  # the chain's clock is 60 s ahead now
    header2, _a2, _s2 = _signed(agent, purchase, payer)
    r2 = _send(agent, purchase, header2)
    settle_outbox()

    assert r2.status_code in (200, 202), (r2.status_code, r2.content[:300])
    assert chain.received_from(payer.address) == PRICE_ATOMIC == _counted(payer.address)
