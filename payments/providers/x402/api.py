"""The x402 rail's adapter: the only Verity module (besides tests and the config/ launchers)
that imports `web3` or talks to a facilitator.

Two parts, both returning provider-neutral results (payments.providers.base):
- `FacilitatorClient.settle` — a thin HTTP client of our own. The SDK's
  `HTTPFacilitatorClient` raises on any non-200 and drops the body, and a hosted
  facilitator answers `settlement_pending` as HTTP 500 (docs/x402.md): we keep the status
  *and* the body and classify them here (docs/x402.md#how-a-settle-is-classified).
- `ChainReader.read` — read-only reconciliation from the chain: the token's
  `authorizationState(from, nonce)`, the `AuthorizationUsed` / `AuthorizationCanceled` logs
  (they find the transfer even without a transaction hash), the stored transaction's
  receipt and confirmations, and the chain's own time against `validBefore`. Never a
  write, never a second settle.

Fault drills (test mode): `arm_drill(payer, nonce, mode)` makes the next settle of that
authorization misbehave after (or instead of) the real request, like the Stripe adapter's
FaultDrillHTTPClient: nothing about the facilitator or the chain is faked.
"""

from __future__ import annotations

import logging
import secrets
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field

import requests
from django.conf import settings

# py_ecc (imported by web3/eth-account) raises the interpreter's recursion limit to 100000
# at import. Deeply nested JSON would then overflow the C stack instead of raising
# RecursionError, which the API and webhook parsers turn into a 400
# (tests/api/test_hostile_input.py). Keep the interpreter's own limit.
_RECURSION_LIMIT = sys.getrecursionlimit()
from web3 import Web3  # noqa: E402
from web3.exceptions import BlockNotFound, TransactionNotFound, Web3RPCError  # noqa: E402
from web3.providers.rpc.utils import (  # noqa: E402
    REQUEST_RETRY_ALLOWLIST,
    ExceptionRetryConfiguration,
)
from x402.extensions.payment_identifier import (  # noqa: E402
    PAYMENT_IDENTIFIER,
    declare_payment_identifier_extension,
    extract_payment_identifier,
)
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization  # noqa: E402
from x402.mechanisms.evm.types import ExactEIP3009Authorization  # noqa: E402
from x402.mechanisms.evm.verify import verify_eoa_signature  # noqa: E402
from x402.schemas import (  # noqa: E402
    PaymentPayload,
    PaymentRequired,
    PaymentRequirements,
    ResourceInfo,
)

sys.setrecursionlimit(_RECURSION_LIMIT)

from payments.enums import Classification, Outcome, Reason  # noqa: E402

from ..base import CallResult, ProviderObject  # noqa: E402
from .auth import (  # noqa: E402
    FacilitatorAuth,
    FacilitatorCredentialInvalid,
    NoAuth,
    facilitator_auth,
)

log = logging.getLogger(__name__)

OBJECT_TYPE = "x402_transfer"


# The chain-level statuses an x402_transfer object carries (X402Transfer.outcome_for maps
# them): confirmed -> succeeded; pending -> awaiting_provider; expired/canceled/invalid ->
# failed; unknown -> unknown; anything else: no verdict.
class ChainStatus:
    CONFIRMED = "confirmed"
    PENDING = "pending"
    EXPIRED = "expired"
    CANCELED = "canceled"
    INVALID = "invalid"
    UNKNOWN = "unknown"
    UNUSED = "unused"  # the authorization is still usable: no verdict
    # The payer's nonce was used by a transaction that moved nothing to pay_to (EIP-3009
    # nonces are the payer's, shared by every transfer/receive/cancel on the token): the
    # authorization to Verity can never move money. Applied as `invalid` with the stable
    # reason USED_ELSEWHERE_REASON (payments.providers.base knows only the chain words).
    USED_ELSEWHERE = "used_elsewhere"


USED_ELSEWHERE_REASON = Reason.AUTHORIZATION_USED_ELSEWHERE.value


class X402Transfer(ProviderObject):
    """An EIP-3009 authorization's transfer (or a refund's transfer back) as the chain
    shows it: the x402 rail's vocabulary (payments.providers.base.ProviderObject)."""

    @property
    def final(self) -> bool:
        # Read from the chain only (no webhooks): mined, expired, cancelled or unusable.
        return self.status in (
            ChainStatus.CONFIRMED,
            ChainStatus.EXPIRED,
            ChainStatus.CANCELED,
            ChainStatus.INVALID,
        )

    @property
    def canceled(self) -> bool:
        return self.status == ChainStatus.CANCELED

    @property
    def money_in_flight(self) -> bool:
        # Broadcast but not mined: `pending`, or an authorization still `unused` whose
        # transaction hash is known (it may still land).
        return self.status == ChainStatus.PENDING or (
            self.status == ChainStatus.UNUSED and bool(self.id)
        )

    @property
    def refund_returned_nothing(self) -> bool:
        return self.status in (ChainStatus.INVALID, ChainStatus.EXPIRED, ChainStatus.CANCELED)

    @property
    def refund_in_flight(self) -> bool:
        return self.status == ChainStatus.PENDING

    @property
    def succeeded(self) -> bool:
        return self.status == ChainStatus.CONFIRMED

    def outcome_for(self, kind: str) -> Outcome | None:
        # What the chain (or the facilitator's answer) says of one EIP-3009 authorization
        # or transfer back (docs/x402.md#reconciled-from-the-chain-only): `unused` (still
        # usable) is no verdict.
        return _CHAIN_OUTCOME.get(self.status)

    def shows_no_money_moved(self, kind: str) -> bool:
        # `unused` is not proof (a broadcast transfer may still be mined); the no-money
        # states (expired, canceled, invalid) are verdicts already.
        return False


_CHAIN_OUTCOME = {
    ChainStatus.CONFIRMED: Outcome.SUCCEEDED,
    ChainStatus.PENDING: Outcome.AWAITING_PROVIDER,
    ChainStatus.EXPIRED: Outcome.FAILED,
    ChainStatus.CANCELED: Outcome.FAILED,
    ChainStatus.INVALID: Outcome.FAILED,
    ChainStatus.UNKNOWN: Outcome.UNKNOWN,
}


class SettleKind:
    SUCCESS = "success"
    PENDING = "pending"
    INVALID = "invalid"
    UNKNOWN = "unknown"
    NOT_SENT = "not_sent"


class DrillMode:
    # The facilitator settles for real; its answer is then dropped (a reset after the
    # request was written): Verity cannot know what happened.
    DROP_ANSWER_AFTER_SEND = "drop_answer_after_send"
    ALL = (DROP_ANSWER_AFTER_SEND,)


# Verify reasons that prove the facilitator refused before broadcasting anything and that
# the same authorization would be refused again. Deliberately NOT here: a used nonce (it
# may be our own earlier transfer), an expired `validBefore` (the chain decides), and any
# `transaction_failed` (a broadcast may have happened).
_INVALID_REASONS = {
    "invalid_exact_evm_payload_signature": "authorization_invalid",
    "invalid_exact_evm_payload_recipient_mismatch": "authorization_invalid",
    "invalid_exact_evm_payload_authorization_value_mismatch": "authorization_invalid",
    "invalid_exact_evm_payload_authorization_valid_after": "authorization_invalid",
    "invalid_exact_evm_payload_undeployed_smart_wallet": "authorization_invalid",
    "invalid_exact_evm_failed_to_verify_signature": "authorization_invalid",
    "invalid_exact_evm_token_name_mismatch": "authorization_invalid",
    "invalid_exact_evm_token_version_mismatch": "authorization_invalid",
    "invalid_exact_evm_eip3009_not_supported": "authorization_invalid",
    "invalid_exact_evm_failed_to_get_network_config": "authorization_invalid",
    "invalid_exact_evm_insufficient_balance": "insufficient_balance",
    "missing_eip712_domain": "authorization_invalid",
    "network_mismatch": "authorization_invalid",
    "unsupported_scheme": "authorization_invalid",
    "eip6492_factory_not_allowed": "authorization_invalid",
    "asset_not_deployed_contract": "authorization_invalid",
}


@dataclass(frozen=True)
class SettleAnswer:
    """One settle request, classified (docs/x402.md#how-a-settle-is-classified)."""

    kind: str
    http_status: int | None = None
    transaction: str = ""
    network: str = ""
    error_reason: str = ""
    reason: str = ""  # Verity's stable reason for `invalid`
    body: dict = field(default_factory=dict)  # the facilitator's SettleResponse, safe fields
    fault_drill: str = ""
    detail: str = ""


def classify_settle(status: int | None, body: dict | None) -> SettleAnswer:
    """Pure: an HTTP status and the (possibly absent) JSON body -> SettleAnswer."""
    body = body if isinstance(body, dict) else {}
    tx = str(body.get("transaction") or "")
    network = str(body.get("network") or "")
    reason = str(body.get("errorReason") or "")
    safe = {
        k: body[k]
        for k in ("success", "errorReason", "payer", "transaction", "network", "amount")
        if k in body
    }
    common = dict(
        http_status=status, transaction=tx, network=network, error_reason=reason, body=safe
    )
    if status == 200 and body.get("success") is True and tx:
        return SettleAnswer(SettleKind.SUCCESS, **common)
    if status in (401, 403) and not tx:
        # The credential was refused: the facilitator did nothing with the payload.
        return SettleAnswer(
            SettleKind.NOT_SENT, detail=f"facilitator refused the credential ({status})", **common
        )
    # Pending is pending whatever the status line says (one hosted facilitator sends 500).
    if reason == "settlement_pending" and tx:
        return SettleAnswer(SettleKind.PENDING, **common)
    if (
        status is not None
        and status < 500
        and body.get("success") is False
        and not tx
        and reason in _INVALID_REASONS
    ):
        return SettleAnswer(SettleKind.INVALID, reason=_INVALID_REASONS[reason], **common)
    # 5xx, a failure after a possible broadcast (hash or not), a used nonce, anything else.
    return SettleAnswer(SettleKind.UNKNOWN, **common)


class FacilitatorUnsupported(RuntimeError):
    """The facilitator's /supported does not list the configured scheme and network."""


class FacilitatorClient:
    def __init__(
        self, *, base_url: str, timeout: float, auth: FacilitatorAuth | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.auth = auth or NoAuth()
        self._drills: dict[str, str] = {}
        self._lock = threading.Lock()
        self._supported: set[tuple[str, str]] = set()

    def _headers(self, method: str, url: str) -> dict:
        # A hosted facilitator authenticates every call: a static bearer token, or (the CDP
        # facilitator) a JWT minted for this method, host and path (x402/auth.py).
        return self.auth.headers(method=method, url=url)

    def ensure_supported(self, *, scheme: str, network: str) -> None:
        """Once per process: the facilitator's /supported lists (x402 v2, scheme, network).
        Raises FacilitatorUnsupported on a definite "no" (or a refused credential); an
        unreachable facilitator is left to the settle's own classification."""
        if (scheme, network) in self._supported:
            return
        try:
            url = f"{self.base_url}/supported"
            resp = requests.get(url, headers=self._headers("GET", url), timeout=(3.0, 10.0))
        except requests.exceptions.RequestException:
            return
        if resp.status_code in (401, 403):
            raise FacilitatorUnsupported(
                f"the facilitator refused Verity's credential "
                f"({resp.status_code}): X402_FACILITATOR_AUTH_TOKEN "
                "or X402_FACILITATOR_API_KEY_ID / _SECRET"
            )
        try:
            kinds = resp.json().get("kinds") or []
        except (ValueError, AttributeError):
            return
        if resp.status_code != 200:
            return
        if not any(
            k.get("scheme") == scheme and k.get("network") == network and k.get("x402Version") == 2
            for k in kinds
            if isinstance(k, dict)
        ):
            raise FacilitatorUnsupported(
                f"the facilitator does not support {scheme} on {network} (x402 v2)"
            )
        self._supported.add((scheme, network))

    # -- fault drills (test mode) ---------------------------------------------------
    def arm_drill(self, *, payer: str, nonce: str, mode: str) -> None:
        if mode not in DrillMode.ALL:
            raise ValueError(f"unknown x402 drill {mode}")
        if not settings.FAULT_DRILLS_ENABLED:
            raise RuntimeError("fault drills are disabled")
        with self._lock:
            self._drills[f"{payer.lower()}:{nonce.lower()}"] = mode

    def _take_drill(self, payer: str, nonce: str) -> str:
        with self._lock:
            return self._drills.pop(f"{payer.lower()}:{nonce.lower()}", "")

    # -- settle -----------------------------------------------------------------------
    def settle(self, *, payload: dict, requirements: dict, payer: str, nonce: str) -> SettleAnswer:
        drill = self._take_drill(payer, nonce)
        body = {"x402Version": 2, "paymentPayload": payload, "paymentRequirements": requirements}
        try:
            url = f"{self.base_url}/settle"
            resp = requests.post(
                url, json=body, headers=self._headers("POST", url), timeout=(3.0, self.timeout)
            )
        except requests.exceptions.ConnectTimeout as exc:
            return SettleAnswer(SettleKind.NOT_SENT, detail=f"connect timeout: {exc}"[:200])
        except requests.exceptions.ConnectionError as exc:
            # Refused before anything was written vs. reset after: only the former is safe.
            if _never_connected(exc):
                return SettleAnswer(SettleKind.NOT_SENT, detail=f"not sent: {exc}"[:200])
            return SettleAnswer(SettleKind.UNKNOWN, detail=f"connection lost: {exc}"[:200])
        except requests.exceptions.Timeout as exc:
            return SettleAnswer(SettleKind.UNKNOWN, detail=f"read timeout: {exc}"[:200])
        if drill == DrillMode.DROP_ANSWER_AFTER_SEND:
            return SettleAnswer(
                SettleKind.UNKNOWN,
                fault_drill=drill,
                detail="fault drill: answer dropped after the request",
            )
        try:
            parsed = resp.json()
        except ValueError:
            parsed = None
        return classify_settle(resp.status_code, parsed)


def _never_connected(exc: Exception) -> bool:
    text = repr(exc)
    return "NewConnectionError" in text or "Connection refused" in text


# -- the chain ---------------------------------------------------------------------------
_TOKEN_ABI = [
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

    def safe_fields(self) -> dict:
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
_TRANSFER_TOPIC = "0x" + Web3.keccak(text="Transfer(address,address,uint256)").hex().removeprefix(
    "0x"
)


def transfer_logs(logs, *, asset: str, sender: str, to: str, value: int) -> list:
    """The asset's Transfer(sender -> to, value) entries among a receipt's logs."""
    return [
        entry
        for entry in logs
        if entry["address"].lower() == asset.lower()
        and len(entry["topics"]) == 3
        and _hex(entry["topics"][0]) == _TRANSFER_TOPIC
        and _hex(entry["topics"][1])[-40:] == sender.lower()[2:]
        and _hex(entry["topics"][2])[-40:] == to.lower()[2:]
        and int(_hex(entry["data"]), 16) == value
    ]


_AUTHORIZATION_USED_TOPIC = "0x" + Web3.keccak(
    text="AuthorizationUsed(address,bytes32)"
).hex().removeprefix("0x")


def _address_topic(address: str) -> str:
    return "0x" + "0" * 24 + address.lower()[2:]


def authorization_transfer(logs, *, asset: str, payer: str, nonce: str, pay_to: str, value: int):
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
    logs = list(logs)
    for i, entry in enumerate(logs):
        topics = [_hex(t) for t in entry["topics"]]
        if (
            entry["address"].lower() != asset.lower()
            or len(topics) != 3
            or topics[0] != _AUTHORIZATION_USED_TOPIC
            or topics[1] != _address_topic(payer)
            or topics[2] != nonce.lower()
        ):
            continue
        if i + 1 >= len(logs):
            return None
        moved = transfer_logs([logs[i + 1]], asset=asset, sender=payer, to=pay_to, value=value)
        if moved and int(moved[0]["logIndex"]) == int(entry["logIndex"]) + 1:
            return moved[0]
        return None  # the nonce was used by a transfer elsewhere (to anyone, of anything)
    return None


def _hex(value) -> str:
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
        self.w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 10}))
        self.rpc_url = rpc_url
        self.asset = Web3.to_checksum_address(asset) if asset else ""
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

    def _token(self):
        return self.w3.eth.contract(address=self.asset, abi=_TOKEN_ABI)

    def _auth_log(
        self, event: str, payer: str, nonce: str, latest: int, from_block: int | None = None
    ) -> dict | None:
        sig = Web3.keccak(text=f"{event}(address,bytes32)")
        topics = [_hex(sig), "0x" + "0" * 24 + payer.lower()[2:], nonce.lower()]
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
    ) -> dict | None:
        """THIS authorization's Transfer(payer -> pay_to, value) log in the transaction's
        receipt (authorization_transfer), or None: the only proof that Verity was paid."""
        receipt = self.w3.eth.get_transaction_receipt(transaction)
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
        payer = Web3.to_checksum_address(payer)
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
        payer = Web3.to_checksum_address(payer)
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
                receipt = self.w3.eth.get_transaction_receipt(transaction)
                receipt_status = int(receipt["status"])
            except Exception:  # noqa: BLE001 - not mined (pending or dropped)
                receipt_status = None
        common = dict(
            authorization_state=used, chain_time=chain_time, receipt_status=receipt_status
        )
        if used:
            found = self._auth_log("AuthorizationUsed", payer, nonce, latest, from_block)
            if found is not None:
                block = int(found["blockNumber"])
                confs = latest - block + 1
                used_by = _hex(found["transactionHash"])
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
        except (Web3RPCError, BlockNotFound):  # the node refuses the tag: no finality signal
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
        sig = Web3.keccak(text="Transfer(address,address,uint256)")
        logs = self.w3.eth.get_logs(
            {
                "address": self.asset,
                "fromBlock": 0,
                "toBlock": "latest",
                "topics": [
                    _hex(sig),
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


def chain_call_result(fn) -> CallResult:
    """Run one chain read as a CallResult (RPC unreachable -> unknown, no verdict)."""
    try:
        return CallResult(Classification.OK, object=fn())
    except Exception as exc:  # noqa: BLE001 - any RPC failure is absence of evidence
        log.warning("x402 chain read failed: %s", exc)
        return CallResult(Classification.UNKNOWN, detail=f"chain read failed: {exc}"[:200])


# -- refunds: a separate token transfer back to the payer ---------------------------------
REFUND_GAS = 120_000  # an ERC-20 transfer of FiatTokenV2_2 uses about 40 000

# Two refunds signed at the same moment in two processes read the same pending nonce; the
# node then refuses the later broadcast. These answers (anvil 1.7: RPC error -32003 with
# exactly these messages; geth says the same) prove that the refused transaction entered
# no mempool *because another transaction of the signer holds its nonce* — mined ("nonce
# too low") or pending at the same gas price ("replacement transaction underpriced"). The
# signed bytes never left Verity otherwise, so re-signing with a fresh nonce cannot make
# two transfers. Nothing else is retried: funds, gas, a lost connection stay as they were.
_NONCE_TAKEN = ("nonce too low", "replacement transaction underpriced")
# The same signed transaction is already in the node's pool (geth / anvil): in flight.
_ALREADY_IN_POOL = ("already known", "transaction already imported")
REFUND_NONCE_ATTEMPTS = 3  # signs per send: the first and at most two after a taken nonce
# Two things make "refused" mean "this transaction is in no mempool", found on the chain:
# - web3's HTTPProvider re-posts eth_sendRawTransaction by itself after a read timeout or
#   a 5xx; the node then answers "nonce too low" / "already imported" for *our own*
#   transaction, accepted the first time. The refund signer's provider never re-posts it.
# - two refunds of the same value to the same payer, signed at the same nonce and gas
#   price, are byte-identical: one transfer would be taken for both. A random tag after
#   the ABI arguments (the token's decoder ignores trailing calldata; 16 bytes cost 256
#   gas) makes every signed refund transaction unique.
_REFUND_RETRY = ExceptionRetryConfiguration(
    errors=(ConnectionError, requests.HTTPError, requests.Timeout),
    method_allowlist=[m for m in REQUEST_RETRY_ALLOWLIST if m != "eth_sendRawTransaction"],
)
_REFUND_TAG_BYTES = 16


def _answer_says(text: str, phrases: tuple[str, ...]) -> bool:
    lowered = text.lower()
    return any(phrase in lowered for phrase in phrases)


@dataclass(frozen=True)
class RefundAnswer:
    """One refund transfer, sent (or not), classified with the SettleKind words."""

    kind: str
    transaction: str = ""
    block_number: int | None = None
    reason: str = ""
    fault_drill: str = ""
    detail: str = ""
    attempts: int = 1  # signs of this send (more than one: the signer's nonce was taken)
    # The send gave up before anything (new) could leave because its caller no longer holds
    # the claim (ClaimLost): whoever settled the operation owns it; nothing is applied.
    aborted: bool = False


class ClaimLost(Exception):
    """Raised by a RefundSender.send hook: the operation is no longer the one this send
    claimed (settled or swept meanwhile). Nothing more may be signed or broadcast."""


def _aborted(exc: ClaimLost, *, transaction: str = "", attempts: int = 1) -> RefundAnswer:
    return RefundAnswer(
        SettleKind.NOT_SENT,
        transaction=transaction,
        attempts=attempts,
        aborted=True,
        detail=f"aborted, nothing sent: {exc}"[:200],
    )


@dataclass(frozen=True)
class _Broadcast:
    """The transaction the node accepted, or the final answer when none was accepted."""

    signed: object | None
    answer: RefundAnswer


class RefundSender:
    """Signs and broadcasts `transfer(payer, value)` from the refund signer: a separate
    refund account with a small float that finance tops up, never the receiving account
    pay_to (config/settings/security.py refuses that key). The signed
    transaction's hash and nonce are handed to `on_signed` (which persists them) before
    the broadcast, so a lost answer leaves a hash to read.
    A broadcast refused because another transaction of the signer took the nonce is
    re-signed with a fresh nonce and `on_signed` is called again (it overwrites the stored
    hash and nonce of the same refund): at most REFUND_NONCE_ATTEMPTS signs. Verity's
    refunds take their nonces one at a time across processes (`send(serialize=...)`), so
    that refusal comes only from a transaction of the signer made outside Verity."""

    def __init__(
        self, *, rpc_url: str, asset: str, private_key: str, receipt_timeout: float
    ) -> None:
        self.rpc_url = rpc_url
        self.w3 = Web3(
            Web3.HTTPProvider(
                rpc_url, request_kwargs={"timeout": 10}, exception_retry_configuration=_REFUND_RETRY
            )
        )
        self.asset = Web3.to_checksum_address(asset)
        self._key = private_key
        self.address = self.w3.eth.account.from_key(private_key).address
        self.receipt_timeout = receipt_timeout
        self._drills: dict[str, str] = {}
        self._lock = threading.Lock()
        # Nonce read -> sign -> persist -> broadcast of one refund at a time in this process
        # (threads of one worker never race for a nonce); `send(serialize=...)` does the
        # same across processes. Another transaction of the signer made outside Verity can
        # still take the nonce: the retry below covers it. Neither is held while waiting
        # for the receipt.
        self._send_lock = threading.Lock()

    def arm_drill(self, *, to: str, mode: str) -> None:
        if mode not in DrillMode.ALL:
            raise ValueError(f"unknown x402 drill {mode}")
        if not settings.FAULT_DRILLS_ENABLED:
            raise RuntimeError("fault drills are disabled")
        with self._lock:
            self._drills[to.lower()] = mode

    def _take_drill(self, to: str) -> str:
        with self._lock:
            return self._drills.pop(to.lower(), "")

    def send(
        self,
        *,
        to: str,
        value: int,
        on_signed,
        serialize: Callable[[], AbstractContextManager] = nullcontext,
        still_claimed: Callable[[], None] = lambda: None,
        wait_slice_seconds: float = 5.0,
    ) -> RefundAnswer:
        """`serialize()` is the signer's nonce allocator across processes (Verity passes
        payments.locks.signer_lock): entered around nonce read -> sign -> persist ->
        broadcast, left before the receipt wait. If it cannot be entered, nothing was
        signed: not_sent.

        The claim: `still_claimed()` raises ClaimLost when the caller no
        longer holds the send it claimed, and renews its lease otherwise. It runs while
        this send waits for another send of this process (every `wait_slice_seconds`) and
        once the signer is held, before the nonce read and the sign; `on_signed` may raise
        ClaimLost too, before the broadcast. After ClaimLost nothing (new) leaves: the
        answer is `aborted`."""
        to = Web3.to_checksum_address(to)
        try:
            # A live wait for this process's other send, not a dead worker's.
            while not self._send_lock.acquire(timeout=wait_slice_seconds):
                still_claimed()
        except ClaimLost as exc:
            return _aborted(exc)
        try:
            with ExitStack() as held:
                try:
                    held.enter_context(serialize())
                    still_claimed()  # compare-and-set before the nonce read and the sign
                except ClaimLost as exc:
                    return _aborted(exc)
                except Exception as exc:  # noqa: BLE001 - no nonce read, nothing signed
                    return RefundAnswer(
                        SettleKind.NOT_SENT, detail=f"not sent: signer lock: {exc}"[:200]
                    )
                sent = self._sign_and_broadcast(to=to, value=value, on_signed=on_signed)
        finally:
            self._send_lock.release()
        if sent.signed is None:
            return sent.answer
        tx_hash, attempts, note = sent.answer.transaction, sent.answer.attempts, sent.answer.detail
        if self._take_drill(to) == DrillMode.DROP_ANSWER_AFTER_SEND:
            return RefundAnswer(
                SettleKind.UNKNOWN,
                transaction=tx_hash,
                fault_drill=DrillMode.DROP_ANSWER_AFTER_SEND,
                attempts=attempts,
                detail="fault drill: answer dropped after the broadcast",
            )
        try:
            receipt = self.w3.eth.wait_for_transaction_receipt(
                sent.signed.hash, timeout=self.receipt_timeout, poll_latency=0.2
            )
        except Exception as exc:  # noqa: BLE001 - broadcast, not mined yet (or unreachable)
            return RefundAnswer(
                SettleKind.PENDING,
                transaction=tx_hash,
                attempts=attempts,
                detail=f"{note}no receipt yet: {exc}"[:200],
            )
        if int(receipt["status"]) != 1:
            return RefundAnswer(
                SettleKind.INVALID,
                transaction=tx_hash,
                block_number=int(receipt["blockNumber"]),
                attempts=attempts,
                reason="provider_failed",
                detail=f"{note}transfer reverted"[:200],
            )
        return RefundAnswer(
            SettleKind.SUCCESS,
            transaction=tx_hash,
            block_number=int(receipt["blockNumber"]),
            attempts=attempts,
            detail=note.rstrip("; ")[:200],
        )

    def _sign_and_broadcast(self, *, to: str, value: int, on_signed) -> _Broadcast:
        """Under the send lock and `serialize()`. Each signed transaction is broadcast
        once; only a refusal that proves another transaction holds its nonce leads to a
        new sign."""
        token = self.w3.eth.contract(address=self.asset, abi=_TOKEN_ABI)
        refused: RefundAnswer | None = None
        taken: list[int] = []
        for attempt in range(1, REFUND_NONCE_ATTEMPTS + 1):
            try:
                nonce = self.w3.eth.get_transaction_count(self.address, "pending")
                tx = token.functions.transfer(to, value).build_transaction(
                    {
                        "from": self.address,
                        "nonce": nonce,
                        "gas": REFUND_GAS,
                        "gasPrice": self.w3.eth.gas_price,
                        "chainId": self.w3.eth.chain_id,
                    }
                )
                tx["data"] = tx["data"] + secrets.token_hex(_REFUND_TAG_BYTES)
            except Exception as exc:  # noqa: BLE001 - nothing (new) was signed or sent
                if refused is not None:  # the refused one is stored: today's answer
                    return _Broadcast(None, refused)
                return _Broadcast(
                    None, RefundAnswer(SettleKind.NOT_SENT, detail=f"not sent: {exc}"[:200])
                )
            signed = self.w3.eth.account.sign_transaction(tx, self._key)
            tx_hash = _hex(signed.hash)
            try:
                # Persisted before it can leave (replaces a refused one), only while the
                # claim holds: a refund settled meanwhile never broadcasts.
                on_signed(tx_hash, nonce)
            except ClaimLost as exc:
                return _Broadcast(
                    None,
                    _aborted(
                        exc, transaction=refused.transaction if refused else "", attempts=attempt
                    ),
                )
            try:
                self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except requests.exceptions.ConnectionError as exc:
                if _never_connected(exc):
                    return _Broadcast(
                        None,
                        RefundAnswer(
                            SettleKind.NOT_SENT,
                            transaction=tx_hash,
                            attempts=attempt,
                            detail=f"not sent: {exc}"[:200],
                        ),
                    )
                return _Broadcast(
                    None,
                    RefundAnswer(
                        SettleKind.UNKNOWN,
                        transaction=tx_hash,
                        attempts=attempt,
                        detail=f"connection lost: {exc}"[:200],
                    ),
                )
            except requests.exceptions.Timeout as exc:
                return _Broadcast(
                    None,
                    RefundAnswer(
                        SettleKind.UNKNOWN,
                        transaction=tx_hash,
                        attempts=attempt,
                        detail=f"timeout: {exc}"[:200],
                    ),
                )
            except Exception as exc:  # noqa: BLE001 - the node answered with an RPC error
                text = str(exc)
                if _answer_says(text, _ALREADY_IN_POOL):
                    return _Broadcast(
                        None,
                        RefundAnswer(
                            SettleKind.PENDING,
                            transaction=tx_hash,
                            attempts=attempt,
                            detail=text[:200],
                        ),
                    )
                # The node refused it: it is in no mempool. Unless the refusal names a
                # taken nonce, the same nonce may still be used again, so the receipt read
                # decides if it is ever mined.
                refused = RefundAnswer(
                    SettleKind.UNKNOWN,
                    transaction=tx_hash,
                    attempts=attempt,
                    detail=f"rpc error: {text}"[:200],
                )
                if not _answer_says(text, _NONCE_TAKEN) or attempt == REFUND_NONCE_ATTEMPTS:
                    return _Broadcast(None, refused)
                # Belt and braces before a new sign: the node must not know this hash (a
                # proxy in front of it that re-posted would make it ours, in flight).
                try:
                    self.w3.eth.get_transaction(signed.hash)
                except TransactionNotFound:
                    pass
                except Exception:  # noqa: BLE001 - cannot tell: keep today's answer
                    return _Broadcast(None, refused)
                else:
                    return _Broadcast(
                        signed,
                        RefundAnswer(
                            SettleKind.PENDING,
                            transaction=tx_hash,
                            attempts=attempt,
                            detail=f"refused ({text[:60]}) yet known to the node; ",
                        ),
                    )
                taken.append(nonce)
                log.warning(
                    "x402 refund %s refused (%s): nonce %s taken by another "
                    "transaction of the signer; signing again",
                    tx_hash,
                    text[:80],
                    nonce,
                )
                continue
            note = (
                f"nonce {', '.join(map(str, taken))} taken by another transaction of the "
                f"signer; sent with nonce {nonce} (sign {attempt}); "
                if taken
                else ""
            )
            return _Broadcast(
                signed,
                RefundAnswer(
                    SettleKind.PENDING, transaction=tx_hash, attempts=attempt, detail=note
                ),
            )
        raise AssertionError("unreachable: the last attempt always returns")


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
            receipt = w3.eth.get_transaction_receipt(transaction)
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
        sig = _hex(Web3.keccak(text="Transfer(address,address,uint256)"))
        moved = [
            entry
            for entry in receipt["logs"]
            if entry["address"].lower() == reader.asset.lower()
            and _hex(entry["topics"][0]) == sig
            and _hex(entry["topics"][1])[-40:] == sender.lower()[2:]
            and _hex(entry["topics"][2])[-40:] == to.lower()[2:]
            and int(_hex(entry["data"]), 16) == value
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
        and int(w3.eth.get_transaction_count(Web3.to_checksum_address(sender), "latest")) > nonce
    ):
        # Another transaction of the signer took this nonce: this one can never be mined.
        return ChainView(ChainStatus.INVALID, transaction=transaction)
    # Broadcast (or maybe not) and unmined: no verdict.
    return ChainView(ChainStatus.UNUSED, transaction=transaction)


_refund_sender: RefundSender | None = None


def get_refund_sender() -> RefundSender:
    """The refund signer (X402_REFUND_PRIVATE_KEY, from the environment only). Built
    again when a setting it was built from changes (as the chain reader is): a signer
    kept from before a change would send to the old node, or wait the old receipt time."""
    global _refund_sender
    with _lock:
        key = settings.X402_REFUND_PRIVATE_KEY
        if not key:
            raise RuntimeError("X402_REFUND_PRIVATE_KEY is not set")
        if (
            _refund_sender is None
            or _refund_sender._key != key
            or _refund_sender.asset.lower() != settings.X402_ASSET.lower()
            or _refund_sender.rpc_url != settings.X402_RPC_URL
            or _refund_sender.receipt_timeout != settings.X402_REFUND_RECEIPT_TIMEOUT
        ):
            _refund_sender = RefundSender(
                rpc_url=settings.X402_RPC_URL,
                asset=settings.X402_ASSET,
                private_key=key,
                receipt_timeout=settings.X402_REFUND_RECEIPT_TIMEOUT,
            )
        return _refund_sender


def refund_account_address() -> str:
    """The refund account (the address of X402_REFUND_PRIVATE_KEY); "" when none is set.
    Never pay_to: Verity holds no key of its receiving account."""
    key = settings.X402_REFUND_PRIVATE_KEY
    return Web3().eth.account.from_key(key).address if key else ""


@dataclass(frozen=True)
class RefundFloat:
    address: str
    balance: int  # the asset's atomic units (USDC: 6 decimals)
    decimals: int

    @property
    def tokens(self) -> float:
        return self.balance / 10**self.decimals


def refund_float() -> RefundFloat | None:
    """Read-only: the refund account's balance of the asset (one eth_call), for the console
    and /metrics. None when no refund key is set; raises when the chain cannot be read."""
    address = refund_account_address()
    if not address or not settings.X402_ASSET:
        return None
    # Its own short-timeout, no-retry client: a scrape or a dashboard view must not wait
    # out the reader's 10-s timeout and web3's retries when the RPC is down.
    w3 = Web3(
        Web3.HTTPProvider(
            settings.X402_RPC_URL, request_kwargs={"timeout": 3}, exception_retry_configuration=None
        )
    )
    token = w3.eth.contract(address=Web3.to_checksum_address(settings.X402_ASSET), abi=_TOKEN_ABI)
    balance = int(token.functions.balanceOf(address).call())
    return RefundFloat(address=address, balance=balance, decimals=settings.X402_DECIMALS)


_facilitator: FacilitatorClient | None = None
_reader: ChainReader | None = None
_lock = threading.Lock()


_facilitator_built_from: tuple = ()


def get_facilitator() -> FacilitatorClient:
    """The facilitator client of the current settings (rebuilt when one changes). A
    credential that cannot be used (a malformed API key secret) raises
    FacilitatorUnsupported: the settle answers 503 and stores nothing."""
    global _facilitator, _facilitator_built_from
    # Compared by digest: the secrets stay in settings only, not in another long-lived
    # object an error report could show.
    built_from = (
        settings.X402_FACILITATOR_URL.rstrip("/"),
        settings.X402_FACILITATOR_TIMEOUT,
        settings.X402_FACILITATOR_API_KEY_ID,
        hashlib.sha256(
            f"{settings.X402_FACILITATOR_AUTH_TOKEN}\0"
            f"{settings.X402_FACILITATOR_API_KEY_SECRET}".encode()
        ).hexdigest(),
    )
    with _lock:
        if _facilitator is None or _facilitator_built_from != built_from:
            try:
                auth = facilitator_auth(
                    token=settings.X402_FACILITATOR_AUTH_TOKEN,
                    key_id=settings.X402_FACILITATOR_API_KEY_ID,
                    key_secret=settings.X402_FACILITATOR_API_KEY_SECRET,
                )
            except FacilitatorCredentialInvalid as exc:
                raise FacilitatorUnsupported(str(exc)) from None
            _facilitator = FacilitatorClient(
                base_url=settings.X402_FACILITATOR_URL,
                timeout=settings.X402_FACILITATOR_TIMEOUT,
                auth=auth,
            )
            _facilitator_built_from = built_from
        return _facilitator


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


# -- the x402 v2 HTTP transport (the SDK's schemas) ----------------------------------------
import base64  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402

PAYMENT_REQUIRED_HEADER = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE_HEADER = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE_HEADER = "PAYMENT-RESPONSE"


class PaymentSignatureInvalid(ValueError):
    pass


@dataclass(frozen=True)
class SignedPayment:
    """A decoded PAYMENT-SIGNATURE: the EIP-3009 authorization and what identifies it."""

    payload: dict  # the PaymentPayload as sent (camelCase), forwarded to the facilitator
    accepted: dict
    payer: str
    to: str
    value: str
    valid_after: int
    valid_before: int
    nonce: str
    signature_hash: str
    payload_hash: str
    payment_identifier: str
    signature: str = ""


_PAYLOAD_KEYS = {"authorization", "signature"}
_AUTH_KEYS = {"from", "to", "value", "validAfter", "validBefore", "nonce"}


def _uint256(raw) -> int:
    """EIP-3009's uint256 fields: a decimal integer (string or number) in range."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError("not an integer")
    value = int(raw)
    if not 0 <= value < 2**256:
        raise ValueError("out of uint256 range")
    return value


def forwarded_payload(signed: SignedPayment, requirements: dict) -> dict:
    """The PaymentPayload the facilitator settles: rebuilt from what Verity checked (the
    authorization's six fields, the signature, Verity's own requirements as `accepted`),
    never the buyer's document as sent."""
    auth = signed.payload["payload"]["authorization"]
    out = {
        "x402Version": 2,
        "accepted": requirements,
        "payload": {
            "authorization": {k: auth[k] for k in sorted(_AUTH_KEYS)},
            "signature": signed.signature,
        },
    }
    if signed.payload.get("resource"):
        out["resource"] = signed.payload["resource"]
    return out


def signature_matches(
    signed: SignedPayment, *, chain_id: int, token_name: str, token_version: str, asset: str
) -> bool:
    """The EIP-712 TransferWithAuthorization signature recovers to `from` (an EOA's
    signature). False for anything else, including a contract wallet's (EIP-1271/6492),
    which only the chain can judge."""
    try:
        sig = bytes.fromhex(signed.signature[2:])
        if len(sig) != 65:
            return False
        digest = hash_eip3009_authorization(
            ExactEIP3009Authorization(
                from_address=signed.payer,
                to=signed.to,
                value=signed.value,
                valid_after=str(signed.valid_after),
                valid_before=str(signed.valid_before),
                nonce=signed.nonce,
            ),
            chain_id,
            Web3.to_checksum_address(asset),
            token_name,
            token_version,
        )
        return verify_eoa_signature(digest, sig, signed.payer)
    except Exception:  # noqa: BLE001 - unrecoverable: not an EOA's signature of this
        return False


_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def signature_refused_by_token(signed: SignedPayment) -> bool:
    """An EOA's 65-byte signature the token refuses (OpenZeppelin ECDSA.tryRecover, used
    by FiatTokenV2_2's SignatureChecker): s in the upper half of the curve order (a
    malleated signature) or v not 27/28. A longer signature is a contract wallet's: the
    chain judges it."""
    try:
        sig = bytes.fromhex(signed.signature[2:])
    except ValueError:
        return True
    if len(sig) != 65:
        return False
    return int.from_bytes(sig[32:64], "big") > _SECP256K1_N // 2 or sig[64] not in (27, 28)


def requirements_for(
    *,
    amount_atomic: int,
    network: str,
    asset: str,
    pay_to: str,
    max_timeout_seconds: int,
    token_name: str,
    token_version: str,
) -> dict:
    return PaymentRequirements(
        scheme="exact",
        network=network,
        asset=asset,
        amount=str(amount_atomic),
        pay_to=pay_to,
        max_timeout_seconds=max_timeout_seconds,
        extra={"name": token_name, "version": token_version},
    ).model_dump(by_alias=True, exclude_none=True)


def payment_required(
    *, requirements: dict, resource_url: str, description: str, error: str = ""
) -> dict:
    return PaymentRequired(
        x402_version=2,
        error=error or None,
        resource=ResourceInfo(
            url=resource_url, description=description, mime_type="application/json"
        ),
        accepts=[PaymentRequirements.model_validate(requirements)],
        extensions={PAYMENT_IDENTIFIER: declare_payment_identifier_extension()},
    ).model_dump(by_alias=True, exclude_none=True)


def encode_header(value: dict) -> str:
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()


def decode_header(value: str) -> dict:
    return json.loads(base64.b64decode(value.encode(), validate=False).decode())


def parse_payment_signature(header: str) -> SignedPayment:
    try:
        raw = decode_header(header.strip())
        payload = PaymentPayload.model_validate(raw)
    except Exception as exc:  # noqa: BLE001 - anything undecodable is the sender's error
        raise PaymentSignatureInvalid(
            "PAYMENT-SIGNATURE is not a base64 x402 v2 payment payload"
        ) from exc
    if payload.x402_version != 2:
        raise PaymentSignatureInvalid("only x402 version 2 is accepted")
    inner = payload.payload or {}
    auth = inner.get("authorization") or {}
    signature = str(inner.get("signature") or "")
    # Exactly what Verity checks and nothing beside it: a Permit2 authorization next to the
    # EIP-3009 one would be settled as Permit2 by the facilitator.
    if set(inner) != _PAYLOAD_KEYS or not isinstance(auth, dict) or set(auth) != _AUTH_KEYS:
        raise PaymentSignatureInvalid(
            "the payload must be exactly an EIP-3009 authorization "
            "(authorization: from, to, value, validAfter, "
            "validBefore, nonce; signature) and nothing else"
        )
    try:
        payer = Web3.to_checksum_address(auth["from"])
        to = Web3.to_checksum_address(auth["to"])
        value = str(_uint256(auth["value"]))
        valid_after = _uint256(auth["validAfter"])
        valid_before = _uint256(auth["validBefore"])
        nonce = str(auth["nonce"]).lower()
        if not (nonce.startswith("0x") and len(nonce) == 66):
            raise ValueError("nonce")
        int(nonce, 16)
        if not signature.startswith("0x") or len(signature) < 132:
            raise ValueError("signature")
    except (KeyError, TypeError, ValueError) as exc:
        raise PaymentSignatureInvalid(
            "the payload is not an EIP-3009 authorization "
            "(from, to, value, validAfter, validBefore, nonce, "
            "signature)"
        ) from exc
    try:
        identifier = extract_payment_identifier(payload) or ""
    except Exception:  # noqa: BLE001 - a malformed extension is no identifier
        identifier = ""
    dumped = payload.model_dump(by_alias=True, exclude_none=True)
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":")).encode()
    return SignedPayment(
        payload=dumped,
        accepted=dumped["accepted"],
        payer=payer,
        to=to,
        value=value,
        signature=signature,
        valid_after=valid_after,
        valid_before=valid_before,
        nonce=nonce,
        signature_hash=hashlib.sha256(signature.lower().encode()).hexdigest(),
        payload_hash=hashlib.sha256(canonical).hexdigest(),
        payment_identifier=str(identifier)[:128],
    )


def settle_response(
    *,
    success: bool,
    transaction: str,
    network: str,
    payer: str,
    error_reason: str = "",
    amount: str = "",
) -> dict:
    body = {"success": success, "transaction": transaction, "network": network, "payer": payer}
    if error_reason:
        body["errorReason"] = error_reason
    if amount:
        body["amount"] = amount
    return body
