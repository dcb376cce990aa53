"""Batched EIP-3009 authorizations in ONE transaction, in every order, against the proof
"AuthorizationUsed(payer, nonce) immediately followed by this call's Transfer". A small
forwarder (hand-assembled, like tests/x402/chain.py's) calls, per item, any target with
any 9-word call: transferWithAuthorization, receiveWithAuthorization, a plain transfer,
on the real token or on a second FiatTokenV2_2. Both purchases' settles are pending when
the payer's own batch front-runs them. Judged from raw logs (ChainJudge) and DB rows."""

from __future__ import annotations

import secrets

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from web3 import Web3

from payments import services
from payments.models import PaymentOperation, X402Authorization
from recovery.models import LedgerEntry, StepRun
from tests.outbox import settle_outbox
from tests.x402.chain import _assemble
from tests.x402.chainside import PRICE_ATOMIC, audit, charge, send, signed
from tools import x402_chain

pytestmark = pytest.mark.django_db(transaction=True)

_CALL = 4 + 9 * 32
_SIZE = bytes([0x61]) + _CALL.to_bytes(2, "big")
# Calldata: items of (32-byte target word, 292 bytes of call). Reverts if any call fails.
_RUNTIME = _assemble(
    [
        0x60,
        0x00,  # [off=0]
        ("label", "loop"),
        0x36,
        0x81,
        0x10,
        0x15,
        ("push2", "end"),
        0x57,  # off >= cds -> end
        _SIZE,
        0x81,
        0x60,
        0x20,
        0x01,
        0x60,
        0x00,
        0x37,  # CALLDATACOPY(0, off+32, SIZE)
        0x60,
        0x00,
        0x60,
        0x00,
        _SIZE,
        0x60,
        0x00,
        0x60,
        0x00,  # ret 0,0 args SIZE@0 value 0
        0x85,
        0x35,  # DUP6 CALLDATALOAD: the target at off
        0x5A,
        0xF1,  # GAS CALL
        0x15,
        ("push2", "fail"),
        0x57,
        0x61,
        (_CALL + 32).to_bytes(2, "big"),
        0x01,  # off += 32 + SIZE
        ("push2", "loop"),
        0x56,
        ("label", "end"),
        0x00,
        ("label", "fail"),
        0x60,
        0x00,
        0x60,
        0x00,
        0xFD,
    ]
)

_TWA = (
    "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,"
    "uint8,bytes32,bytes32)"
)
_RWA = (
    "receiveWithAuthorization(address,address,uint256,uint256,uint256,bytes32,"
    "uint8,bytes32,bytes32)"
)


def _deploy_forwarder(chain) -> str:
    n = len(_RUNTIME)
    init = bytes([0x60, n, 0x80, 0x60, 11, 0x60, 0, 0x39, 0x60, 0, 0xF3]) + _RUNTIME
    tx = chain.w3.eth.send_transaction({"from": chain.admin, "data": Web3.to_hex(init)})
    address = chain.w3.eth.wait_for_transaction_receipt(tx, timeout=30)["contractAddress"]
    assert chain.w3.eth.get_code(address) == _RUNTIME
    return address


def _sign(account, *, token: str, primary: str, to: str, value: int, nonce: str, valid_before: int):
    kind = [
        {"name": "from", "type": "address"},
        {"name": "to", "type": "address"},
        {"name": "value", "type": "uint256"},
        {"name": "validAfter", "type": "uint256"},
        {"name": "validBefore", "type": "uint256"},
        {"name": "nonce", "type": "bytes32"},
    ]
    data = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            primary: kind,
        },
        "primaryType": primary,
        "domain": {
            "name": x402_chain.TOKEN_NAME,
            "version": x402_chain.TOKEN_VERSION,
            "chainId": x402_chain.CHAIN_ID,
            "verifyingContract": Web3.to_checksum_address(token),
        },
        "message": {
            "from": account.address,
            "to": Web3.to_checksum_address(to),
            "value": value,
            "validAfter": 0,
            "validBefore": valid_before,
            "nonce": bytes.fromhex(nonce[2:]),
        },
    }
    return account.sign_message(encode_typed_data(full_message=data))


class Batch:
    def __init__(self, chain, forwarder: str) -> None:
        self.chain, self.forwarder, self.items = chain, forwarder, []
        self.until = int(chain.w3.eth.get_block("latest")["timestamp"]) + 3600

    def _token(self, address: str | None):
        return self.chain.w3.eth.contract(
            address=address or self.chain.token.address, abi=self.chain.token.abi
        )

    def authorized(
        self,
        account,
        *,
        to: str,
        value: int,
        nonce: str | None = None,
        receive: bool = False,
        token: str | None = None,
    ) -> str:
        nonce = nonce or "0x" + secrets.token_hex(32)
        contract = self._token(token)
        sig = _sign(
            account,
            token=contract.address,
            value=value,
            nonce=nonce,
            primary="ReceiveWithAuthorization" if receive else "TransferWithAuthorization",
            to=to,
            valid_before=self.until,
        )
        fn = contract.get_function_by_signature(_RWA if receive else _TWA)
        data = fn(
            account.address,
            Web3.to_checksum_address(to),
            value,
            0,
            self.until,
            bytes.fromhex(nonce[2:]),
            sig.v,
            sig.r.to_bytes(32, "big"),
            sig.s.to_bytes(32, "big"),
        )._encode_transaction_data()
        self._add(contract.address, data)
        return nonce

    def genuine(self, auth: dict, signature: str) -> None:
        sig = bytes.fromhex(signature[2:])
        fn = self.chain.token.get_function_by_signature(_TWA)
        data = fn(
            Web3.to_checksum_address(auth["from"]),
            Web3.to_checksum_address(auth["to"]),
            int(auth["value"]),
            int(auth["validAfter"]),
            int(auth["validBefore"]),
            bytes.fromhex(auth["nonce"][2:]),
            sig[64],
            sig[:32],
            sig[32:64],
        )._encode_transaction_data()
        self._add(self.chain.token.address, data)

    def plain_transfer(self, to: str, value: int) -> None:
        """The forwarder's own transfer (a third party's money) to `to`."""
        data = self.chain.token.functions.transfer(
            Web3.to_checksum_address(to), value
        )._encode_transaction_data()
        self._add(self.chain.token.address, data)

    def _add(self, target: str, data: str) -> None:
        raw = bytes.fromhex(data[2:])
        self.items.append(bytes(12) + bytes.fromhex(target[2:]) + raw.ljust(_CALL, b"\0"))

    def send(self) -> str:
        tx = {
            "from": self.chain.admin,
            "to": self.forwarder,
            "data": Web3.to_hex(b"".join(self.items)),
            "gas": 250_000 * len(self.items) + 50_000,
            "gasPrice": self.chain.w3.eth.gas_price * 20,
        }
        return Web3.to_hex(self.chain.w3.eth.send_transaction(tx))


def _pending_pair(agent, report, chain, payer_1, payer_2):
    """Purchase 1 signed by payer_1 (N), purchase 2 by payer_2 (M), both settles pending."""
    p1, p2 = agent.new_purchase(report.sku), agent.new_purchase(report.sku)
    h1, a1, s1 = signed(agent, p1, payer_1)
    h2, a2, s2 = signed(agent, p2, payer_2)
    chain.automine(False)
    for p, h in ((p1, h1), (p2, h2)):
        r = send(agent, p, h)
        assert r.status_code == 202 and r.json()["code"] == "settlement_pending", r.content
    return (p1, h1, a1, s1), (p2, h2, a2, s2)


def _land(agent, chain, batch: Batch, *purchases_and_headers):
    tx = batch.send()
    chain.mine()
    chain.automine(True)
    receipt = chain.w3.eth.wait_for_transaction_receipt(tx, timeout=30)
    assert receipt["status"] == 1, "the batch reverted"
    chain.mine(2)
    for p, h in purchases_and_headers:
        services.operation_reconcile(operation_id=charge(p).id, actor="test")
        send(agent, p, h)  # the agent's retry with the same payload
    settle_outbox()
    return tx


def _judged(chain, *purchases):
    """No purchase counted without its own transfer; no log counted twice; per payer never
    more counted than arrived (the chain judge, from call traces and raw logs)."""
    result = audit(chain, *purchases)
    assert result.violations == [], result.violations
    for p in purchases:
        op = charge(p)
        delivered = StepRun.objects.filter(purchase_id=p["id"], step="deliverable").exists()
        booked = LedgerEntry.objects.filter(purchase_id=p["id"]).exists()
        paid = result.paid[op.id] is not None
        assert (op.outcome == "succeeded") == paid, (p["id"], op.outcome, op.reason, paid)
        assert delivered == paid and booked == paid, (p["id"], delivered, booked, paid)
    return result


def test_self_transfer_first_then_the_genuine_one(agent, report, chain):
    payer = chain.new_payer()
    forwarder = _deploy_forwarder(chain)
    (p1, h1, a1, _s1), (p2, h2, a2, s2) = _pending_pair(agent, report, chain, payer, payer)
    batch = Batch(chain, forwarder)
    batch.authorized(payer, to=payer.address, value=1, nonce=a1["nonce"])
    batch.genuine(a2, s2)
    _land(agent, chain, batch, (p1, h1), (p2, h2))

    _judged(chain, p1, p2)
    assert (charge(p1).outcome, charge(p2).outcome) == ("failed", "succeeded")
    assert chain.received_from(payer.address) == PRICE_ATOMIC


def test_third_party_transfers_to_pay_to_around_a_self_transfer(agent, report, chain):
    """Payer A spends N on itself; right after it, in the same transaction: payer C's own
    authorization to pay_to of the full price (no purchase), the forwarder's plain
    transfer to pay_to of the full price, and payer B's genuine M."""
    a, b, c = chain.new_payer(), chain.new_payer(), chain.new_payer()
    forwarder = _deploy_forwarder(chain)
    chain.token.functions.mint(forwarder, PRICE_ATOMIC).transact({"from": chain.admin})
    (p1, h1, a1, _s1), (p2, h2, a2, s2) = _pending_pair(agent, report, chain, a, b)
    batch = Batch(chain, forwarder)
    batch.authorized(a, to=a.address, value=1, nonce=a1["nonce"])
    batch.authorized(c, to=chain.pay_to, value=PRICE_ATOMIC)
    batch.plain_transfer(chain.pay_to, PRICE_ATOMIC)
    batch.genuine(a2, s2)
    _land(agent, chain, batch, (p1, h1), (p2, h2))

    _judged(chain, p1, p2)
    assert (charge(p1).outcome, charge(p2).outcome) == ("failed", "succeeded")
    assert chain.received_from(a.address) == 0


def test_the_price_split_over_two_authorizations(agent, report, chain):
    """N moves price - 1 to pay_to, another nonce moves 1 unit to pay_to: the full price
    arrived from the payer, but not by THIS authorization's transfer."""
    payer = chain.new_payer()
    forwarder = _deploy_forwarder(chain)
    (p1, h1, a1, _s1), (p2, h2, a2, s2) = _pending_pair(agent, report, chain, payer, payer)
    batch = Batch(chain, forwarder)
    batch.authorized(payer, to=chain.pay_to, value=PRICE_ATOMIC - 1, nonce=a1["nonce"])
    batch.authorized(payer, to=chain.pay_to, value=1)
    batch.genuine(a2, s2)
    _land(agent, chain, batch, (p1, h1), (p2, h2))

    _judged(chain, p1, p2)
    assert charge(p1).outcome != "succeeded"


def test_the_full_price_to_another_pay_to(agent, report, chain):
    payer = chain.new_payer()
    other = Account.create().address
    forwarder = _deploy_forwarder(chain)
    (p1, h1, a1, _s1), (p2, h2, a2, s2) = _pending_pair(agent, report, chain, payer, payer)
    batch = Batch(chain, forwarder)
    batch.genuine(a2, s2)
    batch.authorized(payer, to=other, value=PRICE_ATOMIC, nonce=a1["nonce"])
    _land(agent, chain, batch, (p1, h1), (p2, h2))

    _judged(chain, p1, p2)
    assert charge(p1).outcome == "failed"


def test_receive_with_authorization_spends_the_nonce(agent, report, chain):
    """N used by receiveWithAuthorization (to the forwarder, its msg.sender) of the full
    price, right before M's genuine transfer to pay_to."""
    payer = chain.new_payer()
    forwarder = _deploy_forwarder(chain)
    (p1, h1, a1, _s1), (p2, h2, a2, s2) = _pending_pair(agent, report, chain, payer, payer)
    batch = Batch(chain, forwarder)
    batch.authorized(payer, to=forwarder, value=PRICE_ATOMIC, nonce=a1["nonce"], receive=True)
    batch.genuine(a2, s2)
    _land(agent, chain, batch, (p1, h1), (p2, h2))

    _judged(chain, p1, p2)
    assert (charge(p1).outcome, charge(p2).outcome) == ("failed", "succeeded")


def test_both_genuine_in_reverse_order_pay_both_once(agent, report, chain):
    payer = chain.new_payer()
    forwarder = _deploy_forwarder(chain)
    (p1, h1, a1, s1), (p2, h2, a2, s2) = _pending_pair(agent, report, chain, payer, payer)
    batch = Batch(chain, forwarder)
    batch.genuine(a2, s2)
    batch.genuine(a1, s1)
    tx = _land(agent, chain, batch, (p1, h1), (p2, h2))

    result = _judged(chain, p1, p2)
    assert {charge(p).outcome for p in (p1, p2)} == {"succeeded"}
    proofs = {(x.proof_transaction, x.proof_log_index) for x in X402Authorization.objects.all()}
    assert len(proofs) == 2 and {t for t, _i in proofs} == {tx}
    assert set(result.paid.values()) == proofs
    assert chain.received_from(payer.address) == 2 * PRICE_ATOMIC


def test_a_second_token_pays_pay_to_with_the_same_nonce(agent, report, chain):
    """A second FiatTokenV2_2 (same name, its own address): the payer pays pay_to the full
    price with nonce N there, and spends N on the real token on itself, in one
    transaction. Same event signatures, another contract."""
    payer = chain.new_payer()
    other_token = x402_chain.deploy(
        chain.w3.provider.endpoint_uri, payers=[payer.address], facilitator=chain.admin
    )["asset"]
    forwarder = _deploy_forwarder(chain)
    (p1, h1, a1, _s1), (p2, h2, a2, s2) = _pending_pair(agent, report, chain, payer, payer)
    batch = Batch(chain, forwarder)
    batch.authorized(
        payer, to=chain.pay_to, value=PRICE_ATOMIC, nonce=a1["nonce"], token=other_token
    )
    batch.authorized(payer, to=payer.address, value=1, nonce=a1["nonce"])
    batch.genuine(a2, s2)
    _land(agent, chain, batch, (p1, h1), (p2, h2))

    _judged(chain, p1, p2)
    assert (charge(p1).outcome, charge(p2).outcome) == ("failed", "succeeded")
    assert PaymentOperation.objects.filter(outcome="succeeded").count() == 1
