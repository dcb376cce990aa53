"""The refund signer: a refund on this rail is a separate token transfer back to the payer,
signed and broadcast by `RefundSender.send` from a refund account with a small float
(never the receiving account), and that account's balance (`refund_float`)."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import Protocol

import requests
from django.conf import settings

from . import sdk
from .chain import TOKEN_ABI, as_hex
from .objects import DrillMode, SettleKind, never_connected
from .sdk import HexBytes, HexStr

log = logging.getLogger(__name__)

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
def _refund_retry() -> sdk.ExceptionRetryConfiguration:
    return sdk.ExceptionRetryConfiguration(
        errors=(ConnectionError, requests.HTTPError, requests.Timeout),
        method_allowlist=[m for m in sdk.REQUEST_RETRY_ALLOWLIST if m != "eth_sendRawTransaction"],
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


# Called with a signed transaction's hash and nonce before its broadcast (it persists them);
# may raise ClaimLost.
OnSigned = Callable[[str, int], None]


class _SignedTransaction(Protocol):
    """What the refund signer reads of eth-account's SignedTransaction."""

    @property
    def hash(self) -> HexBytes: ...

    @property
    def raw_transaction(self) -> HexBytes: ...


@dataclass(frozen=True)
class _Broadcast:
    """The transaction the node accepted, or the final answer when none was accepted."""

    signed: _SignedTransaction | None
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
        self.w3 = sdk.Web3(
            sdk.Web3.HTTPProvider(
                rpc_url,
                request_kwargs={"timeout": 10},
                exception_retry_configuration=_refund_retry(),
            )
        )
        self.asset = sdk.Web3.to_checksum_address(asset)
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
        on_signed: OnSigned,
        serialize: Callable[[], AbstractContextManager[object]] = nullcontext,
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
        to = sdk.Web3.to_checksum_address(to)
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

    def _sign_and_broadcast(self, *, to: str, value: int, on_signed: OnSigned) -> _Broadcast:
        """Under the send lock and `serialize()`. Each signed transaction is broadcast
        once; only a refusal that proves another transaction holds its nonce leads to a
        new sign."""
        token = self.w3.eth.contract(address=self.asset, abi=TOKEN_ABI)
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
                data = tx["data"]
                if not isinstance(data, str):  # web3 builds calldata as hex text
                    raise TypeError("the transfer's calldata is not hex text")
                tx["data"] = HexStr(data + secrets.token_hex(_REFUND_TAG_BYTES))
            except Exception as exc:  # noqa: BLE001 - nothing (new) was signed or sent
                if refused is not None:  # the refused one is stored: today's answer
                    return _Broadcast(None, refused)
                return _Broadcast(
                    None, RefundAnswer(SettleKind.NOT_SENT, detail=f"not sent: {exc}"[:200])
                )
            signed = self.w3.eth.account.sign_transaction(tx, self._key)
            tx_hash = as_hex(signed.hash)
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
                if never_connected(exc):
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
                except sdk.TransactionNotFound:
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


_refund_sender: RefundSender | None = None
_lock = threading.Lock()


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
    return sdk.Web3().eth.account.from_key(key).address if key else ""


@dataclass(frozen=True)
class RefundFloat:
    address: str
    balance: int  # the asset's atomic units (USDC: 6 decimals)
    decimals: int

    @property
    def tokens(self) -> float:
        scale: int = 10**self.decimals
        return self.balance / scale


def refund_float() -> RefundFloat | None:
    """Read-only: the refund account's balance of the asset (one eth_call), for the console
    and /metrics. None when no refund key is set; raises when the chain cannot be read."""
    address = refund_account_address()
    if not address or not settings.X402_ASSET:
        return None
    # Its own short-timeout, no-retry client: a scrape or a dashboard view must not wait
    # out the reader's 10-s timeout and web3's retries when the RPC is down.
    w3 = sdk.Web3(
        sdk.Web3.HTTPProvider(
            settings.X402_RPC_URL, request_kwargs={"timeout": 3}, exception_retry_configuration=None
        )
    )
    token = w3.eth.contract(
        address=sdk.Web3.to_checksum_address(settings.X402_ASSET), abi=TOKEN_ABI
    )
    balance = int(token.functions.balanceOf(address).call())
    return RefundFloat(address=address, balance=balance, decimals=settings.X402_DECIMALS)
