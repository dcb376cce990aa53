"""The payer's and the chain operator's side of the x402 tests and of `make drill-x402`:
steer the throwaway chain with anvil's own RPC methods, read the real token, and sign
EIP-3009 authorizations with the x402 SDK's EVM client. Needs tests.stack --x402."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import requests

_RECURSION_LIMIT = sys.getrecursionlimit()  # py_ecc raises it (see payments.providers.x402)
from eth_account import Account  # noqa: E402
from web3 import Web3  # noqa: E402
from x402 import x402ClientSync  # noqa: E402
from x402.extensions.payment_identifier import append_payment_identifier_to_extensions  # noqa: E402
from x402.mechanisms.evm import EthAccountSigner  # noqa: E402
from x402.mechanisms.evm.exact import register_exact_evm_client  # noqa: E402
from x402.schemas import PaymentRequired  # noqa: E402

from tools import x402_chain  # noqa: E402

sys.setrecursionlimit(_RECURSION_LIMIT)

SIGNATURE = "HTTP_PAYMENT_SIGNATURE"


class Chain:
    """Read/steer the throwaway chain. Steering calls are anvil's own RPC methods."""

    def __init__(self) -> None:
        self.w3 = Web3(Web3.HTTPProvider(os.environ["X402_RPC_URL"]))
        abi = json.loads(x402_chain.TOKEN_ARTIFACT.read_text())["abi"]
        self.token = self.w3.eth.contract(address=os.environ["X402_ASSET"], abi=abi)
        self.admin = os.environ["X402_CHAIN_ADMIN"]
        self.pay_to = os.environ["X402_PAY_TO"]
        # Refunds are sent from a separate refund account, never from pay_to:
        # the address of the refund key the stack gives Verity (the key stays in tests).
        refund_key = os.environ.get("X402_REFUND_PRIVATE_KEY", "")
        self.refund_account = Account.from_key(refund_key).address if refund_key else ""
        self.facilitator = os.environ["X402_FACILITATOR_URL"]

    def rpc(self, method: str, params=None):
        out = self.w3.provider.make_request(method, params or [])
        if "error" in out:
            raise RuntimeError(f"{method}: {out['error']}")
        return out.get("result")

    def automine(self, on: bool) -> None:
        self.rpc("evm_setAutomine", [on])

    def mine(self, blocks: int = 1) -> None:
        self.rpc("anvil_mine", [hex(blocks)])

    def time_travel(self, seconds: int) -> None:
        self.rpc("evm_increaseTime", [hex(seconds)])
        self.mine()

    def pending(self) -> list[str]:
        block = self.w3.eth.get_block("pending", full_transactions=False)
        return [Web3.to_hex(t) for t in block["transactions"]]

    def drop(self, tx: str) -> None:
        self.rpc("anvil_dropTransaction", [tx])

    def reorg(self, depth: int) -> None:
        """Replace the last `depth` blocks with empty ones: their transactions are gone."""
        self.rpc("anvil_reorg", [depth, []])

    def expire(self, valid_before: int) -> None:
        """Move the chain's clock to validBefore (the contract then refuses the transfer).
        Only that far: later tests sign against the wall clock."""
        if int(self.w3.eth.get_block("latest")["timestamp"]) < valid_before:
            self.rpc("evm_setNextBlockTimestamp", [hex(valid_before)])
        self.mine()

    def reset_clock(self) -> None:
        """Back to the wall clock after a time jump (anvil_setTime), so the next test's
        authorizations, signed against the wall clock, are valid on chain too."""
        import time

        self.rpc("anvil_setTime", [hex(int(time.time()))])
        self.mine()

    def refill_facilitator_nonce(self) -> None:
        """A dropped or reorged-out transaction leaves a gap in the facilitator's nonces
        (its signer counts them itself): fill it with a no-op from that account, as an
        operator would, so later settles are not stuck behind it."""
        fac = Web3.to_checksum_address(os.environ["X402_FACILITATOR_ADDRESS"])
        self.rpc("anvil_impersonateAccount", [fac])
        try:
            self.w3.eth.send_transaction(
                {
                    "from": fac,
                    "to": fac,
                    "value": 0,
                    "nonce": self.w3.eth.get_transaction_count(fac),
                }
            )
            self.mine()
        finally:
            self.rpc("anvil_stopImpersonatingAccount", [fac])

    def transfers(self, payer: str, value: int | None = None) -> int:
        """ERC-20 Transfer events payer -> Verity on chain (the money that moved); only
        those of `value` when given."""
        sig = Web3.keccak(text="Transfer(address,address,uint256)")
        logs = self.w3.eth.get_logs(
            {
                "address": self.token.address,
                "fromBlock": 0,
                "toBlock": "latest",
                "topics": [
                    Web3.to_hex(sig),
                    "0x" + "0" * 24 + payer.lower()[2:],
                    "0x" + "0" * 24 + self.pay_to.lower()[2:],
                ],
            }
        )
        if value is not None:
            logs = [e for e in logs if int(Web3.to_hex(e["data"]), 16) == value]
        return len(logs)

    def transfers_back(self, payer: str, *, sender: str | None = None) -> int:
        """ERC-20 Transfer events Verity -> payer on chain (refunds, transfers back): from
        the refund account, or from `sender` when given."""
        return len(self._transfers_from(sender or self.refund_account, payer))

    def returned_to(self, payer: str) -> int:
        """The atomic units the refund account has sent to `payer`."""
        return sum(
            int(Web3.to_hex(e["data"]), 16)
            for e in self._transfers_from(self.refund_account, payer)
        )

    def received_from(self, payer: str) -> int:
        """The atomic units `payer` has sent to pay_to (every Transfer log)."""
        return sum(
            int(Web3.to_hex(e["data"]), 16) for e in self._transfers_from(payer, self.pay_to)
        )

    def refunds_sent(self) -> int:
        """The atomic units the refund account has sent, to anyone (its outflow)."""
        return sum(
            int(Web3.to_hex(e["data"]), 16) for e in self._transfers_from(self.refund_account, None)
        )

    def _transfers_from(self, sender: str, to: str | None) -> list:
        sig = Web3.keccak(text="Transfer(address,address,uint256)")
        return self.w3.eth.get_logs(
            {
                "address": self.token.address,
                "fromBlock": 0,
                "toBlock": "latest",
                "topics": [
                    Web3.to_hex(sig),
                    "0x" + "0" * 24 + sender.lower()[2:],
                    "0x" + "0" * 24 + to.lower()[2:] if to else None,
                ],
            }
        )

    def balance(self, address: str) -> int:
        return self.token.functions.balanceOf(Web3.to_checksum_address(address)).call()

    def authorization_used(self, payer: str, nonce: str) -> bool:
        return self.token.functions.authorizationState(payer, bytes.fromhex(nonce[2:])).call()

    def new_payer(self, funds: int = 1_000 * 10**6):
        account = Account.create()
        self.token.functions.mint(account.address, funds).transact({"from": self.admin})
        return account

    def blacklist(self, address: str) -> None:
        self.token.functions.blacklist(address).transact({"from": self.admin})

    def cancel_authorization(self, account, nonce: str, gas_price: int | None = None) -> str:
        """The payer cancels its own authorization (EIP-3009 cancelAuthorization), signed
        with its key and sent by the admin (who pays gas)."""
        from eth_account.messages import encode_typed_data

        data = {
            "types": {
                "EIP712Domain": [
                    {"name": "name", "type": "string"},
                    {"name": "version", "type": "string"},
                    {"name": "chainId", "type": "uint256"},
                    {"name": "verifyingContract", "type": "address"},
                ],
                "CancelAuthorization": [
                    {"name": "authorizer", "type": "address"},
                    {"name": "nonce", "type": "bytes32"},
                ],
            },
            "primaryType": "CancelAuthorization",
            "domain": {
                "name": x402_chain.TOKEN_NAME,
                "version": x402_chain.TOKEN_VERSION,
                "chainId": x402_chain.CHAIN_ID,
                "verifyingContract": self.token.address,
            },
            "message": {"authorizer": account.address, "nonce": bytes.fromhex(nonce[2:])},
        }
        signed = account.sign_message(encode_typed_data(full_message=data))
        tx = {"from": self.admin}
        if gas_price:
            tx["gasPrice"] = gas_price
        fn = self.token.get_function_by_signature(
            "cancelAuthorization(address,bytes32,uint8,bytes32,bytes32)"
        )
        return Web3.to_hex(
            fn(
                account.address,
                bytes.fromhex(nonce[2:]),
                signed.v,
                signed.r.to_bytes(32, "big"),
                signed.s.to_bytes(32, "big"),
            ).transact(tx)
        )

    def spend_nonce(
        self,
        account,
        nonce: str,
        *,
        to: str | None = None,
        value: int = 1,
        gas_price: int | None = None,
    ) -> str:
        """The payer spends its own EIP-3009 nonce on another transfer (to itself unless
        `to` is given) with transferWithAuthorization, sent by the admin: the nonce space
        is the payer's, shared by every authorization on the token."""
        to = to or account.address
        now = int(self.w3.eth.get_block("latest")["timestamp"])
        auth = {
            "from": account.address,
            "to": to,
            "value": value,
            "validAfter": 0,
            "validBefore": now + 3600,
            "nonce": nonce,
        }
        sig = authorization_signature(account, auth, self.token.address)
        tx = {"from": self.admin}
        if gas_price:
            tx["gasPrice"] = gas_price
        fn = self.token.get_function_by_signature(
            "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,"
            "uint8,bytes32,bytes32)"
        )
        return Web3.to_hex(
            fn(
                account.address,
                Web3.to_checksum_address(to),
                value,
                0,
                auth["validBefore"],
                bytes.fromhex(nonce[2:]),
                sig.v,
                sig.r.to_bytes(32, "big"),
                sig.s.to_bytes(32, "big"),
            ).transact(tx)
        )

    def paid_in(self, transaction: str, payer: str, value: int) -> bool:
        """The invariant: the transaction carries the asset's
        Transfer(payer -> pay_to, value) log. Money that arrived, per operation."""
        receipt = self.w3.eth.get_transaction_receipt(transaction)
        sig = Web3.to_hex(Web3.keccak(text="Transfer(address,address,uint256)"))
        return receipt["status"] == 1 and any(
            entry["address"].lower() == self.token.address.lower()
            and Web3.to_hex(entry["topics"][0]) == sig
            and Web3.to_hex(entry["topics"][1])[-40:] == payer.lower()[2:]
            and Web3.to_hex(entry["topics"][2])[-40:] == self.pay_to.lower()[2:]
            and int(Web3.to_hex(entry["data"]), 16) == value
            for entry in receipt["logs"]
        )

    def operation_paid(self, auth) -> bool:
        """Per operation: did money arrive for this X402Authorization row? The chain
        judge's answer (ChainJudge.moved_by), independent of how Verity proves it."""
        return ChainJudge(self).operation_paid(auth)

    def deploy_forwarder(self) -> str:
        """A forwarder contract (anyone may deploy one): one transaction that submits any
        number of signed EIP-3009 transfers to the token (FORWARDER_RUNTIME)."""
        init = _forwarder_initcode()
        tx = self.w3.eth.send_transaction({"from": self.admin, "data": init})
        if not self._automining():
            self.mine()
        address = self.w3.eth.wait_for_transaction_receipt(tx, timeout=30)["contractAddress"]
        assert self.w3.eth.get_code(address) == bytes.fromhex(FORWARDER_RUNTIME.hex()), address
        return address

    def _automining(self) -> bool:
        return bool(self.rpc("anvil_getAutomine"))

    def batch_transfers(
        self, forwarder: str, calls: list[tuple[dict, str]], *, gas_price: int | None = None
    ) -> str:
        """ONE transaction through `forwarder` carrying each (authorization, signature 0x..
        of 65 bytes) as its own transferWithAuthorization call to the token: several
        EIP-3009 nonces used by one transaction. Sent by the admin (anyone may submit
        anyone's signed authorizations). Returns the transaction hash."""
        fn = self.token.get_function_by_signature(
            "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,"
            "uint8,bytes32,bytes32)"
        )
        data = bytes(12) + bytes.fromhex(self.token.address[2:])
        for auth, signature in calls:
            sig = bytes.fromhex(signature[2:])
            r, s, v = sig[:32], sig[32:64], sig[64]
            call = fn(
                Web3.to_checksum_address(auth["from"]),
                Web3.to_checksum_address(auth["to"]),
                int(auth["value"]),
                int(auth["validAfter"]),
                int(auth["validBefore"]),
                bytes.fromhex(auth["nonce"][2:]),
                v,
                r,
                s,
            )._encode_transaction_data()
            encoded = bytes.fromhex(call[2:])
            assert len(encoded) == _TWA_CALL_BYTES, len(encoded)
            data += encoded
        tx = {
            "from": self.admin,
            "to": Web3.to_checksum_address(forwarder),
            "data": Web3.to_hex(data),
            "gas": 200_000 * len(calls) + 50_000,
        }
        if gas_price:
            tx["gasPrice"] = gas_price
        return Web3.to_hex(self.w3.eth.send_transaction(tx))

    def authorization_for(
        self, account, *, to: str, value: int, nonce: str | None = None
    ) -> tuple[dict, str]:
        """The payer signs any EIP-3009 transfer of its own (to itself, to pay_to...) with
        `nonce` (a fresh one unless given): (authorization, signature)."""
        import secrets

        now = int(self.w3.eth.get_block("latest")["timestamp"])
        auth = {
            "from": account.address,
            "to": Web3.to_checksum_address(to),
            "value": value,
            "validAfter": 0,
            "validBefore": now + 3600,
            "nonce": nonce or "0x" + secrets.token_hex(32),
        }
        sig = authorization_signature(account, auth, self.token.address)
        return auth, Web3.to_hex(sig.signature)

    def facilitator_config(self, **body) -> None:
        r = requests.post(f"{self.facilitator}/_config", json=body, timeout=5)
        r.raise_for_status()


def sign(header_value: str, account, *, payment_id: str | None = None) -> tuple[str, dict]:
    """The payer's side with the SDK: PAYMENT-REQUIRED -> a PAYMENT-SIGNATURE value.
    Returns (header, the authorization) so tests can find the nonce on chain."""
    from payments.providers.x402 import decode_header, encode_header

    required = PaymentRequired.model_validate(decode_header(header_value))
    client = register_exact_evm_client(x402ClientSync(), EthAccountSigner(account))
    # The payer's own spend controls: the local chain's USDC is not one of the SDK's
    # default assets, so the agent allows it explicitly, capped like a real agent would.
    client.set_spend_controls(
        {
            "allowed_assets": [
                {
                    "network": os.environ["X402_NETWORK"],
                    "asset": os.environ["X402_ASSET"],
                    "max_amount_per_payment": str(1_000 * 10**6),
                }
            ]
        }
    )
    extensions = dict(required.extensions or {})
    if payment_id is not None:
        append_payment_identifier_to_extensions(extensions, payment_id)
    else:
        extensions = {}
    payload = client.create_payment_payload(required, extensions=extensions or None)
    dumped = payload.model_dump(by_alias=True, exclude_none=True)
    return encode_header(dumped), dumped["payload"]["authorization"]


def authorization_signature(account, auth: dict, asset: str):
    """The payer's EIP-712 TransferWithAuthorization signature (any field values)."""
    from eth_account.messages import encode_typed_data

    data = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "TransferWithAuthorization": [
                {"name": "from", "type": "address"},
                {"name": "to", "type": "address"},
                {"name": "value", "type": "uint256"},
                {"name": "validAfter", "type": "uint256"},
                {"name": "validBefore", "type": "uint256"},
                {"name": "nonce", "type": "bytes32"},
            ],
        },
        "primaryType": "TransferWithAuthorization",
        "domain": {
            "name": x402_chain.TOKEN_NAME,
            "version": x402_chain.TOKEN_VERSION,
            "chainId": x402_chain.CHAIN_ID,
            "verifyingContract": Web3.to_checksum_address(asset),
        },
        "message": {
            "from": auth["from"],
            "to": Web3.to_checksum_address(auth["to"]),
            "value": int(auth["value"]),
            "validAfter": int(auth["validAfter"]),
            "validBefore": int(auth["validBefore"]),
            "nonce": bytes.fromhex(auth["nonce"][2:]),
        },
    }
    return account.sign_message(encode_typed_data(full_message=data))


def craft(
    header_value: str,
    account,
    *,
    signer=None,
    inner_extra: dict | None = None,
    accepted_extra: dict | None = None,
    **fields,
) -> tuple[str, dict]:
    """A PAYMENT-SIGNATURE built by hand from PAYMENT-REQUIRED, as a hostile or careless
    buyer could: any authorization field overridden (`fields`, e.g. validBefore), signed
    by `signer` (default: the payer), extra keys beside the authorization."""
    import secrets
    import time

    from payments.providers.x402 import decode_header, encode_header

    required = decode_header(header_value)
    accepted = dict(required["accepts"][0])
    if accepted_extra:
        accepted["extra"] = {**accepted.get("extra", {}), **accepted_extra}
    now = int(time.time())
    auth = {
        "from": account.address,
        "to": accepted["payTo"],
        "value": accepted["amount"],
        "validAfter": str(now - 600),
        "validBefore": str(now + accepted["maxTimeoutSeconds"]),
        "nonce": "0x" + secrets.token_hex(32),
    }
    auth.update({k: str(v) if k != "nonce" else v for k, v in fields.items()})
    sig = authorization_signature(signer or account, auth, accepted["asset"])
    inner = {"authorization": auth, "signature": Web3.to_hex(sig.signature)}
    inner.update(inner_extra or {})
    payload = {"x402Version": 2, "accepted": accepted, "payload": inner}
    if required.get("resource"):
        payload["resource"] = required["resource"]
    return encode_header(payload), auth


# -- a forwarder contract, hand-assembled (no compiler needed) ------------------------------
# Calldata: the target (one 32-byte word), then k transferWithAuthorization calls of the
# 9-word overload (4 + 9 * 32 bytes each). It calls the target with each in turn and reverts
# if any call fails: several EIP-3009 authorizations (several nonces) used by ONE
# transaction, as a multicall or a relayer's batch does on a real chain.
_TWA_CALL_BYTES = 4 + 9 * 32


def _assemble(program: list) -> bytes:
    """A tiny two-pass assembler: ints/bytes are raw, ("push2", label) a label's offset,
    ("label", name) marks a JUMPDEST."""
    labels: dict[str, int] = {}
    for _ in range(2):
        out = bytearray()
        for item in program:
            if isinstance(item, tuple) and item[0] == "label":
                labels[item[1]] = len(out)
                out.append(0x5B)  # JUMPDEST
            elif isinstance(item, tuple) and item[0] == "push2":
                out += bytes([0x61]) + labels.get(item[1], 0).to_bytes(2, "big")
            elif isinstance(item, int):
                out.append(item)
            else:
                out += item
    return bytes(out)


_PUSH1, _PUSH2 = 0x60, 0x61
_SIZE = bytes([_PUSH2]) + _TWA_CALL_BYTES.to_bytes(2, "big")
FORWARDER_RUNTIME = _assemble(
    [
        _PUSH1,
        0x20,  # [off]                      off = 32
        ("label", "loop"),
        0x36,
        0x81,
        0x10,
        0x15,  # CALLDATASIZE DUP2 LT ISZERO: [off, !(off < cds)]
        ("push2", "end"),
        0x57,  # JUMPI end                   [off]
        _SIZE,
        0x81,
        _PUSH1,
        0x00,
        0x37,  # CALLDATACOPY(0, off, SIZE)  [off]
        _PUSH1,
        0x00,
        _PUSH1,
        0x00,  # retSize, retOffset
        _SIZE,
        _PUSH1,
        0x00,
        _PUSH1,
        0x00,  # argsSize, argsOffset 0, value 0
        _PUSH1,
        0x00,
        0x35,  # CALLDATALOAD(0): the target
        0x5A,
        0xF1,  # GAS CALL                    [off, ok]
        0x15,
        ("push2", "fail"),
        0x57,  # ISZERO JUMPI fail           [off]
        _SIZE,
        0x01,  # off += SIZE
        ("push2", "loop"),
        0x56,  # JUMP loop
        ("label", "end"),
        0x00,  # STOP
        ("label", "fail"),
        _PUSH1,
        0x00,
        _PUSH1,
        0x00,
        0xFD,  # REVERT(0, 0)
    ]
)


def _forwarder_initcode() -> str:
    n = len(FORWARDER_RUNTIME)
    # PUSH1 n DUP1 PUSH1 11 PUSH1 0 CODECOPY PUSH1 0 RETURN, then the runtime
    init = bytes([_PUSH1, n, 0x80, _PUSH1, 11, _PUSH1, 0, 0x39, _PUSH1, 0, 0xF3])
    return Web3.to_hex(init + FORWARDER_RUNTIME)


# -- the chain judge ------------------------------------------------------------------------
def _selector(signature: str) -> str:
    return Web3.keccak(text=signature)[:4].hex().removeprefix("0x")


# Every FiatTokenV2_2 entry point that moves value by an EIP-3009 authorization; their first
# six ABI words are (from, to, value, validAfter, validBefore, nonce).
_AUTHORIZED_TRANSFERS = {
    _selector(f"{name}(address,address,uint256,uint256,uint256,bytes32,{tail})")
    for name in ("transferWithAuthorization", "receiveWithAuthorization")
    for tail in ("uint8,bytes32,bytes32", "bytes")
}


@dataclass(frozen=True)
class Move:
    """One successful authorized transfer call to the token, as the call trace shows it."""

    transaction: str
    payer: str
    nonce: str
    to: str
    value: int


@dataclass(frozen=True)
class Audit:
    paid: dict  # operation id -> the Transfer log (transaction, logIndex) that paid it, or None
    violations: list


class ChainJudge:
    """Judges Verity's x402 operations from the raw chain, independently of Verity's code:
    no AuthorizationUsed/Transfer log pairing (Verity's proof), no row Verity wrote about
    the proof. What moved is read from the node's call trace (debug_traceTransaction,
    callTracer): each successful transferWithAuthorization / receiveWithAuthorization call
    frame to the token, decoded from its calldata (from, to, value, nonce). A frame inside a
    reverted frame or a reverted transaction moved nothing. The k-th such frame moving
    payer -> pay_to in a transaction is the k-th Transfer(payer -> pay_to) log of its receipt
    (the token logs in execution order), so each log is claimed by one authorization."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.token = chain.token.address.lower()
        self._traces: dict[str, list[Move]] = {}

    def _raw_logs(self, event: str, *topics) -> list:
        sig = Web3.to_hex(Web3.keccak(text=event))
        return self.chain.w3.eth.get_logs(
            {
                "address": self.chain.token.address,
                "fromBlock": 0,
                "toBlock": "latest",
                "topics": [sig, *topics],
            }
        )

    def moves(self, transaction: str) -> list[Move]:
        """The authorized transfers a mined transaction really made, in execution order."""
        if transaction not in self._traces:
            receipt = self.chain.w3.eth.get_transaction_receipt(transaction)
            found: list[Move] = []
            if int(receipt["status"]) == 1:
                trace = self.chain.rpc(
                    "debug_traceTransaction", [transaction, {"tracer": "callTracer"}]
                )
                self._walk(trace, transaction, found)
            self._traces[transaction] = found
        return self._traces[transaction]

    def _walk(self, frame: dict, transaction: str, found: list) -> None:
        if frame.get("error"):
            return  # reverted: nothing in it (or below it) happened
        data = (frame.get("input") or "0x")[2:]
        if (
            str(frame.get("to") or "").lower() == self.token
            and frame.get("type", "CALL") == "CALL"
            and data[:8] in _AUTHORIZED_TRANSFERS
            and len(data) >= 8 + 6 * 64
        ):
            words = [data[8 + 64 * i : 8 + 64 * (i + 1)] for i in range(6)]
            found.append(
                Move(
                    transaction,
                    Web3.to_checksum_address("0x" + words[0][-40:]),
                    "0x" + words[5],
                    Web3.to_checksum_address("0x" + words[1][-40:]),
                    int(words[2], 16),
                )
            )
        for child in frame.get("calls") or []:
            self._walk(child, transaction, found)

    def moved_by(self, payer: str, nonce: str) -> Move | None:
        """What the authorization (payer, nonce) moved, wherever and by whomever sent."""
        used = self._raw_logs(
            "AuthorizationUsed(address,bytes32)", "0x" + "0" * 24 + payer.lower()[2:], nonce.lower()
        )
        for log in used:
            for move in self.moves(Web3.to_hex(log["transactionHash"])):
                if move.payer.lower() == payer.lower() and move.nonce == nonce.lower():
                    return move
        return None

    def operation_paid(self, auth) -> bool:
        move = self.moved_by(auth.payer, auth.nonce)
        return (
            move is not None
            and move.to.lower() == self.chain.pay_to.lower()
            and move.value == int(auth.value)
        )

    def paying_log(self, auth) -> tuple[str, int] | None:
        """The Transfer(payer -> pay_to) log (transaction, logIndex) this authorization
        moved, or None."""
        if not self.operation_paid(auth):
            return None
        move = self.moved_by(auth.payer, auth.nonce)
        to_us = [
            m
            for m in self.moves(move.transaction)
            if m.payer.lower() == move.payer.lower() and m.to.lower() == self.chain.pay_to.lower()
        ]
        logs = [
            log
            for log in self.chain.w3.eth.get_transaction_receipt(move.transaction)["logs"]
            if log["address"].lower() == self.token
            and len(log["topics"]) == 3
            and Web3.to_hex(log["topics"][0]) == _TRANSFER_SIG
            and Web3.to_hex(log["topics"][1])[-40:] == move.payer.lower()[2:]
            and Web3.to_hex(log["topics"][2])[-40:] == self.chain.pay_to.lower()[2:]
        ]
        k = to_us.index(move)
        assert len(logs) >= len(to_us), (move.transaction, len(logs), len(to_us))
        return move.transaction, int(logs[k]["logIndex"])

    def audit(self, auths, succeeded: set[str]) -> Audit:
        """Verity's x402 authorizations (X402Authorization rows) against the chain.
        `succeeded`: the operation ids Verity counts as paid. Violations: an operation
        counted without its own transfer; a Transfer log counted for two operations; per
        payer, more counted than the sum of its Transfer logs to pay_to."""
        paid: dict = {}
        violations: list[str] = []
        claimed: dict = {}
        counted: dict = {}
        for auth in auths:
            paid[auth.operation_id] = self.paying_log(auth)
            if auth.operation_id not in succeeded:
                continue
            counted[auth.payer.lower()] = counted.get(auth.payer.lower(), 0) + int(auth.value)
            log = paid[auth.operation_id]
            if log is None:
                violations.append(
                    f"{auth.operation_id}: counted as paid, but its "
                    f"authorization moved nothing to pay_to"
                )
                continue
            if log in claimed:
                violations.append(
                    f"{auth.operation_id}: the Transfer log {log[0]}#{log[1]} "
                    f"is counted for {claimed[log]} too"
                )
            claimed[log] = auth.operation_id
        for payer, amount in counted.items():
            received = self.chain.received_from(payer)
            if amount > received:
                violations.append(
                    f"payer {payer}: Verity counts {amount} received, the "
                    f"chain's Transfer logs to pay_to sum to {received}"
                )
        return Audit(paid, violations)


_TRANSFER_SIG = Web3.to_hex(Web3.keccak(text="Transfer(address,address,uint256)"))
