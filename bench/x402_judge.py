"""The x402 chain judge: what arrived at pay_to, and for which authorization, from the
node's raw record only.

Used by bench/invariants.py (soak), bench/x402_drill.py (`make drill-x402`) and the
lifecycle machine (tests/lifecycle). It imports nothing of Verity's chain code and reads
no row Verity wrote about its proof (`proof_transaction`, `proof_log_index`): it talks
JSON-RPC to the node with `requests` (eth_getLogs, eth_getTransactionReceipt,
debug_traceTransaction with the callTracer) and is given only Verity's claims -- which
authorizations (payer, nonce, value) Verity counts as paid.

How a Transfer log is attributed: every call frame to the token that moves value is one
of its entry points (transferWithAuthorization / receiveWithAuthorization, both ABI forms;
transfer; transferFrom; mint), decoded from the frame's own calldata, and each successful
one emits exactly one Transfer log, in execution order. The frames of a mined transaction
that move value to pay_to, in the order the trace walks them, are lined up with its
Transfer logs to pay_to in log order; each pair must agree on (from, value), or the whole
transaction is "unexplained" (never guessed). A frame inside a reverted frame moved
nothing. So a log carries the (payer, nonce) of the authorization whose call emitted it,
or none (a plain transfer).

The rules (Audit.violations):
- an operation Verity counts as paid has its own log: Transfer(payer -> pay_to, value)
  emitted by ITS authorization (payer, nonce) -- not a log of the same transaction;
- each log (transaction, log index) is claimed by at most one counted operation;
- what Verity counts as received (the sum of its succeeded x402 payments) is at most the
  sum of the Transfer logs to pay_to from the payers Verity saw; once nothing is in
  flight (`settled=True`) the two are equal but for arrivals no authorization of Verity's
  explains (reported: a payer's own transfer, another nonce's), and an arrival that IS
  one of Verity's authorizations of the right value is counted (else: paid, not counted).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import requests
from eth_hash.auto import keccak


def _topic(signature: str) -> str:
    return "0x" + keccak(signature.encode()).hex()


def _selector(signature: str) -> str:
    return keccak(signature.encode())[:4].hex()


TRANSFER = _topic("Transfer(address,address,uint256)")
_AUTH_WORDS = "address,address,uint256,uint256,uint256,bytes32"
# selector -> how to read (from, to, value, nonce) from the ABI words (and the caller)
_AUTHORIZED = {
    _selector(f"{name}({_AUTH_WORDS},{tail})")
    for name in ("transferWithAuthorization", "receiveWithAuthorization")
    for tail in ("uint8,bytes32,bytes32", "bytes")
}
_TRANSFER = _selector("transfer(address,uint256)")
_TRANSFER_FROM = _selector("transferFrom(address,address,uint256)")
_MINT = _selector("mint(address,uint256)")
_ZERO = "0x" + "0" * 40


def _addr(word: str) -> str:
    return "0x" + word[-40:].lower()


@dataclass(frozen=True)
class Arrival:
    """One Transfer log to pay_to, attributed."""

    transaction: str
    log_index: int
    block: int
    sender: str
    value: int
    nonce: str | None  # the authorization's nonce whose call emitted it; None: no authorization
    explained: bool = True  # False: the trace and the logs could not be lined up

    @property
    def key(self) -> tuple[str, int]:
        return (self.transaction, self.log_index)


@dataclass(frozen=True)
class Claim:
    """What Verity says of one authorization: (payer, nonce) for `value`, counted as paid
    (`counted`) or not; `open`: not settled yet (unknown, pending)."""

    operation: str
    payer: str
    nonce: str
    value: int
    counted: bool
    open: bool = False


@dataclass
class Audit:
    paid: dict = field(default_factory=dict)  # operation -> Arrival that paid it, or None
    counted: int = 0  # atomic units Verity counts as received
    received: int = 0  # Transfer logs to pay_to from Verity's payers, summed
    unexplained: list = field(default_factory=list)  # arrivals no claim of Verity's explains
    violations: list = field(default_factory=list)


class RawRpc:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.timeout = timeout
        self.session = requests.Session()
        self._id = 0

    def __call__(self, method: str, *params):
        self._id += 1
        r = self.session.post(
            self.url,
            json={"jsonrpc": "2.0", "id": self._id, "method": method, "params": list(params)},
            timeout=self.timeout,
        )
        r.raise_for_status()
        out = r.json()
        if out.get("error"):
            raise RuntimeError(f"{method}: {out['error']}")
        return out.get("result")


class X402Judge:
    def __init__(self, *, rpc_url: str, token: str, pay_to: str) -> None:
        self.rpc = RawRpc(rpc_url)
        self.token = token.lower()
        self.pay_to = pay_to.lower()
        self._tx: dict[tuple[str, str], list[Arrival]] = {}  # (tx, block hash) -> arrivals

    # -- the raw record -------------------------------------------------------------------
    def arrivals(self) -> list[Arrival]:
        """Every Transfer log to pay_to on the canonical chain, attributed."""
        logs = self.rpc(
            "eth_getLogs",
            {
                "address": self.token,
                "fromBlock": "0x0",
                "toBlock": "latest",
                "topics": [TRANSFER, None, "0x" + "0" * 24 + self.pay_to[2:]],
            },
        )
        seen: dict[tuple[str, str], None] = {}
        for log in logs:
            seen[(log["transactionHash"], log["blockHash"])] = None
        out: list[Arrival] = []
        for tx, block_hash in seen:
            if (tx, block_hash) not in self._tx:
                self._tx[(tx, block_hash)] = self._attribute(tx)
            out.extend(self._tx[(tx, block_hash)])
        return out

    def _attribute(self, tx: str) -> list[Arrival]:
        receipt = self.rpc("eth_getTransactionReceipt", tx)
        if receipt is None or int(receipt["status"], 16) != 1:
            return []
        logs = [
            log
            for log in receipt["logs"]
            if log["address"].lower() == self.token
            and len(log["topics"]) == 3
            and log["topics"][0] == TRANSFER
            and _addr(log["topics"][2]) == self.pay_to
        ]
        frames: list[tuple[str, int, str | None]] = []
        self._walk(self.rpc("debug_traceTransaction", tx, {"tracer": "callTracer"}), frames)
        block = int(receipt["blockNumber"], 16)
        lined_up = len(frames) == len(logs) and all(
            f[0] == _addr(log["topics"][1]) and f[1] == int(log["data"], 16)
            for f, log in zip(frames, logs, strict=False)
        )
        return [
            Arrival(
                tx,
                int(log["logIndex"], 16),
                block,
                _addr(log["topics"][1]),
                int(log["data"], 16),
                frames[i][2] if lined_up else None,
                explained=lined_up,
            )
            for i, log in enumerate(logs)
        ]

    def _walk(self, frame: dict, found: list) -> None:
        if frame.get("error"):
            return  # reverted: nothing in it (or below it) happened
        data = (frame.get("input") or "0x")[2:].lower()
        if (
            str(frame.get("to") or "").lower() == self.token
            and frame.get("type", "CALL") == "CALL"
            and len(data) >= 8
        ):
            words = [data[8 + 64 * i : 8 + 64 * (i + 1)] for i in range((len(data) - 8) // 64)]
            sel = data[:8]
            move = None
            if sel in _AUTHORIZED and len(words) >= 6:
                move = (_addr(words[0]), _addr(words[1]), int(words[2], 16), "0x" + words[5])
            elif sel == _TRANSFER and len(words) >= 2:
                move = (str(frame["from"]).lower(), _addr(words[0]), int(words[1], 16), None)
            elif sel == _TRANSFER_FROM and len(words) >= 3:
                move = (_addr(words[0]), _addr(words[1]), int(words[2], 16), None)
            elif sel == _MINT and len(words) >= 2:
                move = (_ZERO, _addr(words[0]), int(words[1], 16), None)
            if move is not None and move[1] == self.pay_to:
                found.append((move[0], move[2], move[3]))
        for child in frame.get("calls") or []:
            self._walk(child, found)

    # -- the judgement --------------------------------------------------------------------
    def audit(self, claims: list[Claim], *, settled: bool = False) -> Audit:
        arrivals = self.arrivals()
        by_auth = {(a.sender, a.nonce): a for a in arrivals if a.nonce}
        payers = {c.payer.lower() for c in claims}
        out = Audit()
        claimed: dict[tuple[str, int], str] = {}
        explained: set[tuple[str, int]] = set()
        for c in claims:
            hit = by_auth.get((c.payer.lower(), c.nonce.lower()))
            mine = hit if hit is not None and hit.value == c.value else None
            out.paid[c.operation] = mine
            if mine is not None:
                explained.add(mine.key)
            if not c.counted:
                if mine is not None and settled and not c.open:
                    out.violations.append(
                        f"{c.operation}: its transfer {mine.transaction}"
                        f"#{mine.log_index} arrived, Verity does not "
                        f"count it"
                    )
                continue
            out.counted += c.value
            if mine is None:
                out.violations.append(
                    f"{c.operation}: counted as paid, but no Transfer log "
                    f"to pay_to was emitted by its authorization"
                )
                continue
            if mine.key in claimed:
                out.violations.append(
                    f"{c.operation}: log {mine.transaction}#"
                    f"{mine.log_index} is claimed by {claimed[mine.key]} too"
                )
            claimed[mine.key] = c.operation
        mine_ = [a for a in arrivals if a.sender in payers]
        out.received = sum(a.value for a in mine_)
        out.unexplained = [a for a in mine_ if a.key not in explained]
        if out.counted > out.received:
            out.violations.append(
                f"Verity counts {out.counted} received, the Transfer logs "
                f"to pay_to from its payers sum to {out.received}"
            )
        for a in arrivals:
            if not a.explained:
                out.violations.append(
                    f"{a.transaction}#{a.log_index}: a Transfer to pay_to "
                    f"the call trace does not explain"
                )
        dup = [k for k, n in Counter(a.key for a in arrivals).items() if n > 1]
        if dup:
            out.violations.append(f"logs listed twice by the node: {dup[:3]}")
        return out


def judge_from_env() -> X402Judge:
    import os

    return X402Judge(
        rpc_url=os.environ["X402_RPC_URL"],
        token=os.environ["X402_ASSET"],
        pay_to=os.environ["X402_PAY_TO"],
    )


def claims_from_rows(auths) -> list[Claim]:
    """Verity's claims from its X402Authorization rows (their operation's outcome and grade
    only: never the proof columns). A success only a person vouches for (grade
    acknowledged) is not counted as the chain's: it stays open until the chain confirms."""
    out = []
    for a in auths:
        op = a.operation
        confirmed = op.outcome == "succeeded" and op.grade == "confirmed"
        out.append(
            Claim(
                operation=a.operation_id,
                payer=a.payer,
                nonce=a.nonce,
                value=int(a.value),
                counted=confirmed,
                open=op.outcome != "failed" and not confirmed,
            )
        )
    return out
