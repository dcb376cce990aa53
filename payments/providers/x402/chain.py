"""The chain reader: read-only reconciliation from the chain. `ChainReader.read` reads the
token's `authorizationState(from, nonce)`, the `AuthorizationUsed` /
`AuthorizationCanceled` logs (they find the transfer even without a transaction hash), the
stored transaction's receipt and confirmations, and the chain's own time against
`validBefore`; `read_refund_transfer` reads one refund transfer back. Never a write, never
a second settle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings

from payments.enums import Classification

from ..base import CallResult, ProviderObject
from . import sdk
from .objects import OBJECT_TYPE, USED_ELSEWHERE_REASON, ChainStatus, X402Transfer
from .sdk import ChecksumAddress, HexAddress, HexStr

if TYPE_CHECKING:
    from .sdk import Contract, LogReceipt

log = logging.getLogger(__name__)

# One log entry of a receipt (web3's LogReceipt, or the same keys read elsewhere).
Log = Mapping[str, Any]

TOKEN_ABI = [
    {
        "type": "function",
        "name": "authorizationState",
        "stateMutability": "view",
        "inputs": [{"name": "authorizer", "type": "address"}, {"name": "nonce", "type": "bytes32"}],
        "outputs": [{"name": "", "type": "bool"}],
    },
    {
        "type": "function",
        "name": "balanceOf",
        "stateMutability": "view",
        "inputs": [{"name": "account", "type": "address"}],
        "outputs": [{"name": "", "type": "uint256"}],
    },
    {
        "type": "event",
        "name": "AuthorizationUsed",
        "anonymous": False,
        "inputs": [
            {"name": "authorizer", "type": "address", "indexed": True},
            {"name": "nonce", "type": "bytes32", "indexed": True},
        ],
    },
    {
        "type": "event",
        "name": "AuthorizationCanceled",
        "anonymous": False,
        "inputs": [
            {"name": "authorizer", "type": "address", "indexed": True},
            {"name": "nonce", "type": "bytes32", "indexed": True},
        ],
    },
    {
        "type": "function",
        "name": "transfer",
        "stateMutability": "nonpayable",
        "inputs": [{"name": "to", "type": "address"}, {"name": "value", "type": "uint256"}],
        "outputs": [{"name": "", "type": "bool"}],
    },
    {
        "type": "event",
        "name": "Transfer",
        "anonymous": False,
        "inputs": [
            {"name": "from", "type": "address", "indexed": True},
            {"name": "to", "type": "address", "indexed": True},
            {"name": "value", "type": "uint256", "indexed": False},
        ],
    },
]


@dataclass(frozen=True)
class ChainView:
    """What the chain says about one authorization (all read-only)."""

    status: str
    transaction: str = ""
    block_number: int | None = None
    confirmations: int = 0
    authorization_state: bool = False
    chain_time: int = 0
    receipt_status: int | None = None  # of the stored transaction, when mined
    # The proof of payment: the logIndex of THIS authorization's Transfer(payer -> pay_to,
    # value) in `transaction` (authorization_transfer). Set only with a proof.
    proof_log_index: int | None = None

    def safe_fields(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "transaction": self.transaction,
            "block_number": self.block_number,
            "confirmations": self.confirmations,
            "authorization_state": self.authorization_state,
            "chain_time": self.chain_time,
            "receipt_status": self.receipt_status,
            "proof_log_index": self.proof_log_index,
        }


class _Seen(TypedDict):
    """What every ChainView of one read carries, whatever the verdict."""

    authorization_state: bool
    chain_time: int
    receipt_status: int | None


class ChainMismatch(RuntimeError):
    """The RPC's chain id is not X402_NETWORK's."""


@dataclass(frozen=True)
class Precheck:
    """The chain's cheap answers about an authorization before anything is stored."""

    block: int
    used: bool
    balance: int
    is_contract: bool


# How far below the block at which a nonce was read unused the log search starts: deeper
# than any reorg Verity waits out (X402_CONFIRMATIONS), so the log of a reorged use is found.
SEARCH_REORG_MARGIN_BLOCKS = 256
# keccak256 of the event signatures (tests/x402/test_chain_topics.py computes them again).
_TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


def transfer_logs(
    logs: Iterable[Log], *, asset: str, sender: str, to: str, value: int
) -> list[Log]:
    """The asset's Transfer(sender -> to, value) entries among a receipt's logs."""
    return [
        entry
        for entry in logs
        if entry["address"].lower() == asset.lower()
        and len(entry["topics"]) == 3
        and as_hex(entry["topics"][0]) == _TRANSFER_TOPIC
        and as_hex(entry["topics"][1])[-40:] == sender.lower()[2:]
        and as_hex(entry["topics"][2])[-40:] == to.lower()[2:]
        and int(as_hex(entry["data"]), 16) == value
    ]


_AUTHORIZATION_USED_TOPIC = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"


def _address_topic(address: str) -> str:
    return "0x" + "0" * 24 + address.lower()[2:]


def authorization_transfer(
    logs: Iterable[Log], *, asset: str, payer: str, nonce: str, pay_to: str, value: int
) -> Log | None:
    """The Transfer log that THIS authorization moved, or None: the proof that Verity was
    paid by (payer, nonce), from one receipt's logs (in their order).

    FiatTokenV2_2 (contracts/v2/EIP3009.sol `_transferWithAuthorization`) checks the
    signature (a view: an EIP-1271 wallet is asked by staticcall, which cannot log), then
    `_markAuthorizationAsUsed` emits AuthorizationUsed(authorizer, nonce) and `_transfer`
    (v1/FiatTokenV1.sol) emits Transfer(from, to, value) with nothing in between. So the
    transfer of this authorization is the log immediately after its AuthorizationUsed, from
    the same token. Any other Transfer(payer -> pay_to, value) in the same transaction -- a
    multicall or forwarder carrying several authorizations -- is another authorization's
    and proves nothing about this one."""
    entries = list(logs)
    for i, entry in enumerate(entries):
        topics = [as_hex(t) for t in entry["topics"]]
        if (
            entry["address"].lower() != asset.lower()
            or len(topics) != 3
            or topics[0] != _AUTHORIZATION_USED_TOPIC
            or topics[1] != _address_topic(payer)
            or topics[2] != nonce.lower()
        ):
            continue
        if i + 1 >= len(entries):
            return None
        moved = transfer_logs([entries[i + 1]], asset=asset, sender=payer, to=pay_to, value=value)
        if moved and int(moved[0]["logIndex"]) == int(entry["logIndex"]) + 1:
            return moved[0]
        return None  # the nonce was used by a transfer elsewhere (to anyone, of anything)
    return None


def as_hex(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    text = value.hex() if hasattr(value, "hex") and not isinstance(value, str) else str(value)
    return text if text.startswith("0x") else "0x" + text


class ChainReader:
    def __init__(
        self,
        *,
        rpc_url: str,
        asset: str,
        confirmations: int,
        lookback_blocks: int = 0,
        network: str = "",
    ) -> None:
        self.w3 = sdk.Web3(sdk.Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 10}))
        self.rpc_url = rpc_url
        self.asset: ChecksumAddress = (
            sdk.Web3.to_checksum_address(asset)
            if asset
            else ChecksumAddress(HexAddress(HexStr("")))
        )
        self.confirmations = max(1, confirmations)
        self.lookback = lookback_blocks
        self.network = network
        self._chain_checked = False

    def _check_chain(self) -> None:
        """The RPC serves X402_NETWORK's chain: another chain's "unused,
        expired" would fail a real payment, its balance would pass an unfunded one.
        Raises ChainMismatch (a read error: no verdict, nothing settled)."""
        if self._chain_checked or not self.network.startswith("eip155:"):
            return
        expected = int(self.network.split(":", 1)[1])
        actual = int(self.w3.eth.chain_id)
        if actual != expected:
            raise ChainMismatch(
                f"X402_RPC_URL serves chain {actual}, X402_NETWORK is {self.network}"
            )
        self._chain_checked = True

    def _token(self) -> Contract:
        return self.w3.eth.contract(address=self.asset, abi=TOKEN_ABI)

    def _auth_log(
        self, event: str, payer: str, nonce: str, latest: int, from_block: int | None = None
    ) -> LogReceipt | None:
        sig = sdk.Web3.keccak(text=f"{event}(address,bytes32)")
        topics = [as_hex(sig), "0x" + "0" * 24 + payer.lower()[2:], nonce.lower()]
        if from_block is not None:
            # Bounded by the operation: the nonce was read unused at that block before the
            # settle (public RPCs refuse a search from block 0). A reorg margin below it.
            start = max(0, from_block - SEARCH_REORG_MARGIN_BLOCKS)
        else:
            start = max(0, latest - self.lookback) if self.lookback else 0
        logs = self.w3.eth.get_logs(
            {"address": self.asset, "fromBlock": start, "toBlock": latest, "topics": topics}
        )
        return logs[-1] if logs else None

    def proof_in(
        self, transaction: str, *, payer: str, nonce: str, pay_to: str, value: int
    ) -> Log | None:
        """THIS authorization's Transfer(payer -> pay_to, value) log in the transaction's
        receipt (authorization_transfer), or None: the only proof that Verity was paid."""
        receipt = self.w3.eth.get_transaction_receipt(HexStr(transaction))
        if int(receipt["status"]) != 1:
            return None
        return authorization_transfer(
            receipt["logs"], asset=self.asset, payer=payer, nonce=nonce, pay_to=pay_to, value=value
        )

    def precheck(self, *, payer: str, nonce: str) -> Precheck:
        """Before an operation exists: the latest block, whether the payer's nonce is
        already used, the payer's balance and whether the payer is a contract (its
        signature is then EIP-1271's to judge, not ecrecover's). Raises on RPC failure."""
        self._check_chain()
        payer = sdk.Web3.to_checksum_address(payer)
        latest = int(self.w3.eth.block_number)
        token = self._token()
        used = bool(
            token.functions.authorizationState(payer, bytes.fromhex(nonce[2:])).call(
                block_identifier=latest
            )
        )
        balance = int(token.functions.balanceOf(payer).call(block_identifier=latest))
        is_contract = len(self.w3.eth.get_code(payer, block_identifier=latest)) > 0
        return Precheck(block=latest, used=used, balance=balance, is_contract=is_contract)

    def read(
        self,
        *,
        payer: str,
        nonce: str,
        valid_before: int,
        pay_to: str,
        value: int,
        transaction: str = "",
        from_block: int | None = None,
    ) -> ChainView:
        """Raises on RPC failure (the caller records an unknown read, never a verdict).

        A used nonce is a payment only when the transferWithAuthorization call that used
        it moved value to pay_to: its AuthorizationUsed log is immediately followed by
        Transfer(payer -> pay_to, value) (authorization_transfer). The nonce may have been
        spent on any other transfer of the payer's, in a transaction that also carries
        another authorization's transfer to pay_to."""
        self._check_chain()
        payer = sdk.Web3.to_checksum_address(payer)
        latest_block = self.w3.eth.get_block("latest")
        latest, chain_time = int(latest_block["number"]), int(latest_block["timestamp"])
        used = bool(
            self._token()
            .functions.authorizationState(payer, bytes.fromhex(nonce[2:]))
            .call(block_identifier=latest)
        )
        receipt_status = None
        if transaction:
            try:
                receipt = self.w3.eth.get_transaction_receipt(HexStr(transaction))
                receipt_status = int(receipt["status"])
            except Exception:  # noqa: BLE001 - not mined (pending or dropped)
                receipt_status = None
        common: _Seen = {
            "authorization_state": used,
            "chain_time": chain_time,
            "receipt_status": receipt_status,
        }
        if used:
            found = self._auth_log("AuthorizationUsed", payer, nonce, latest, from_block)
            if found is not None:
                block = int(found["blockNumber"])
                confs = latest - block + 1
                used_by = as_hex(found["transactionHash"])
                proof = self.proof_in(used_by, payer=payer, nonce=nonce, pay_to=pay_to, value=value)
                if proof is None:
                    # Spent on another transfer. A verdict only once that block is as
                    # deep as a payment would have to be: a reorg could free the nonce.
                    status = (
                        ChainStatus.USED_ELSEWHERE
                        if confs >= self.confirmations
                        else ChainStatus.PENDING
                    )
                    # The other transaction's block is not this payment's: none is shown.
                    return ChainView(status, transaction=transaction, **common)
                status = (
                    ChainStatus.CONFIRMED if confs >= self.confirmations else ChainStatus.PENDING
                )
                return ChainView(
                    status,
                    transaction=used_by,
                    block_number=block,
                    confirmations=confs,
                    proof_log_index=int(proof["logIndex"]),
                    **common,
                )
            canceled = self._auth_log("AuthorizationCanceled", payer, nonce, latest, from_block)
            if canceled is not None:
                # "Never paid" only once the cancel is as deep as a payment would have to
                # be: a reorg of a shallower block takes the cancel back out, and the
                # signed authorization can then still land.
                confs = latest - int(canceled["blockNumber"]) + 1
                status = (
                    ChainStatus.CANCELED if confs >= self.confirmations else ChainStatus.PENDING
                )
                return ChainView(status, transaction=transaction, **common)
            # Used, but the log lies outside the lookback window: the signed transfer
            # happened somewhere; wait for a person or a wider search, never failed.
            return ChainView(ChainStatus.PENDING, transaction=transaction, **common)
        if chain_time >= valid_before and self._final_time(latest) >= valid_before:
            # No block at or after validBefore can include the transfer (EIP-3009 requires
            # block.timestamp < validBefore), and the block that passed validBefore is as
            # deep as a payment would have to be: a reorg that brings the chain back
            # before validBefore (and lets the transfer land) is one Verity waits out.
            # Unused at `latest` and every block after the final one past validBefore:
            # provably never moved money.
            return ChainView(ChainStatus.EXPIRED, transaction=transaction, **common)
        # Unused and still valid: pending in a mempool, dropped, reverted (a blacklist
        # can be lifted) -- none of them is a failure while the authorization is usable.
        return ChainView(ChainStatus.UNUSED, transaction=transaction, **common)

    def _final_time(self, latest: int) -> int:
        """The timestamp of the newest block at least X402_CONFIRMATIONS deep (-1: the
        chain is not that long yet)."""
        final = latest - self.confirmations + 1
        if final < 0:
            return -1
        return int(self.w3.eth.get_block(final)["timestamp"])

    def finalized_block(self) -> int | None:
        """The number of the RPC's `finalized` block, or None when the RPC has no such tag
        (then depth decides: finality_depth). Raises on RPC failure."""
        try:
            block = self.w3.eth.get_block("finalized")
        except (
            sdk.Web3RPCError,
            sdk.BlockNotFound,
        ):  # the node refuses the tag: no finality signal
            return None
        return int(block["number"]) if block is not None else None

    def is_final(self, block_number: int, *, depth: int) -> bool:
        """A block is final when the RPC's `finalized` tag has reached it, where the RPC
        has one; otherwise when it is `depth` blocks deep (the network's floor)."""
        finalized = self.finalized_block()
        if finalized is not None:
            return block_number <= finalized
        return int(self.w3.eth.block_number) - block_number + 1 >= depth

    def count_transfers(self, *, payer: str, to: str) -> int:
        """Test/drill helper: confirmed ERC-20 Transfer events payer -> to on chain."""
        sig = sdk.Web3.keccak(text="Transfer(address,address,uint256)")
        logs = self.w3.eth.get_logs(
            {
                "address": self.asset,
                "fromBlock": 0,
                "toBlock": "latest",
                "topics": [
                    as_hex(sig),
                    "0x" + "0" * 24 + payer.lower()[2:],
                    "0x" + "0" * 24 + to.lower()[2:],
                ],
            }
        )
        return len(logs)


def transfer_object(
    *, view: ChainView, operation_id: str, purchase_id: str, amount: int, currency: str
) -> ProviderObject:
    """A chain view as the provider-neutral object the one observation function applies."""
    failure = {
        ChainStatus.EXPIRED: "authorization_expired",
        ChainStatus.CANCELED: "authorization_canceled",
        ChainStatus.USED_ELSEWHERE: USED_ELSEWHERE_REASON,
    }.get(view.status, "")
    status = ChainStatus.INVALID if view.status == ChainStatus.USED_ELSEWHERE else view.status
    return X402Transfer(
        OBJECT_TYPE,
        id=view.transaction,
        status=status,
        amount=amount,
        currency=currency,
        failure_code=failure,
        metadata={"operation_id": operation_id, "purchase_id": purchase_id},
    )


def chain_call_result(fn: Callable[[], ProviderObject]) -> CallResult:
    """Run one chain read as a CallResult (RPC unreachable -> unknown, no verdict)."""
    try:
        return CallResult(Classification.OK, object=fn())
    except Exception as exc:  # noqa: BLE001 - any RPC failure is absence of evidence
        log.warning("x402 chain read failed: %s", exc)
        return CallResult(Classification.UNKNOWN, detail=f"chain read failed: {exc}"[:200])


def read_refund_transfer(
    *, transaction: str, sender: str, nonce: int | None, to: str, value: int
) -> ChainView:
    """Read-only: what the chain says of one refund transfer (its receipt and its Transfer
    log; the sender's nonce proves a transaction that can no longer be mined)."""
    reader = get_chain_reader()
    w3 = reader.w3
    latest = int(w3.eth.block_number)
    receipt = None
    if transaction:
        try:
            receipt = w3.eth.get_transaction_receipt(HexStr(transaction))
        except Exception:  # noqa: BLE001 - not mined (pending or dropped)
            receipt = None
    if receipt is not None:
        block = int(receipt["blockNumber"])
        confs = latest - block + 1
        if int(receipt["status"]) != 1:
            return ChainView(
                ChainStatus.INVALID,
                transaction=transaction,
                block_number=block,
                confirmations=confs,
                receipt_status=0,
            )
        sig = as_hex(sdk.Web3.keccak(text="Transfer(address,address,uint256)"))
        moved = [
            entry
            for entry in receipt["logs"]
            if entry["address"].lower() == reader.asset.lower()
            and as_hex(entry["topics"][0]) == sig
            and as_hex(entry["topics"][1])[-40:] == sender.lower()[2:]
            and as_hex(entry["topics"][2])[-40:] == to.lower()[2:]
            and int(as_hex(entry["data"]), 16) == value
        ]
        if not moved:  # mined, but not this transfer: nothing of ours moved
            return ChainView(
                ChainStatus.INVALID,
                transaction=transaction,
                block_number=block,
                confirmations=confs,
                receipt_status=1,
            )
        status = ChainStatus.CONFIRMED if confs >= reader.confirmations else ChainStatus.PENDING
        return ChainView(
            status,
            transaction=transaction,
            block_number=block,
            confirmations=confs,
            receipt_status=1,
        )
    if (
        nonce is not None
        and transaction
        and int(w3.eth.get_transaction_count(sdk.Web3.to_checksum_address(sender), "latest"))
        > nonce
    ):
        # Another transaction of the signer took this nonce: this one can never be mined.
        return ChainView(ChainStatus.INVALID, transaction=transaction)
    # Broadcast (or maybe not) and unmined: no verdict.
    return ChainView(ChainStatus.UNUSED, transaction=transaction)


_reader: ChainReader | None = None
_lock = threading.Lock()


def get_chain_reader() -> ChainReader:
    # Not cached across settings changes (tests change X402_CONFIRMATIONS): every setting
    # it is built from is compared.
    global _reader
    with _lock:
        if (
            _reader is None
            or _reader.confirmations != max(1, settings.X402_CONFIRMATIONS)
            or _reader.asset.lower() != (settings.X402_ASSET or "").lower()
            or _reader.network != settings.X402_NETWORK
            or _reader.rpc_url != settings.X402_RPC_URL
            or _reader.lookback != settings.X402_LOG_LOOKBACK_BLOCKS
        ):
            _reader = ChainReader(
                rpc_url=settings.X402_RPC_URL,
                asset=settings.X402_ASSET,
                confirmations=settings.X402_CONFIRMATIONS,
                lookback_blocks=settings.X402_LOG_LOOKBACK_BLOCKS,
                network=settings.X402_NETWORK,
            )
        return _reader
