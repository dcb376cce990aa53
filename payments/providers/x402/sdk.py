"""web3 and the x402 SDK: the one place the rail imports them from.

Loaded on first use, not at import: web3, eth-account and the SDK's EVM mechanisms take
about 0.6 s of CPU to import, which every Django process paid at start (each gunicorn and
Celery worker, every `manage.py` command) whether or not it ever touched the rail. The
light names (eth_typing's address and hex types, HexBytes) are imported here at once; the
others (`LAZY`) on the first read of any of them as `sdk.<name>` (PEP 562), which imports
them all. The rail's modules read them through the module (`sdk.Web3`), never by name at
their own import.

py_ecc (imported by web3/eth-account) raises the interpreter's recursion limit to 100000
at import. Deeply nested JSON would then overflow the C stack instead of raising
RecursionError, which the API and webhook parsers turn into a 400
(tests/api/test_hostile_input.py). `load` runs in a process already serving requests on
other threads, so the limit is never raised, not even for the length of the import:
`sys.setrecursionlimit` is refused while it runs (nothing else sets it).
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import TYPE_CHECKING, Any

from eth_typing import ChecksumAddress, HexAddress, HexStr
from hexbytes import HexBytes

if TYPE_CHECKING:
    from web3 import Web3
    from web3.contract import Contract
    from web3.exceptions import BlockNotFound, TransactionNotFound, Web3RPCError
    from web3.providers.rpc.utils import REQUEST_RETRY_ALLOWLIST, ExceptionRetryConfiguration
    from web3.types import LogReceipt
    from x402.extensions.payment_identifier import (
        PAYMENT_IDENTIFIER,
        declare_payment_identifier_extension,
        extract_payment_identifier,
    )
    from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
    from x402.mechanisms.evm.types import ExactEIP3009Authorization
    from x402.mechanisms.evm.verify import verify_eoa_signature
    from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo

# name -> the module it comes from, imported on the first read of any of them.
LAZY = {
    "Web3": "web3",
    "Contract": "web3.contract",
    "BlockNotFound": "web3.exceptions",
    "TransactionNotFound": "web3.exceptions",
    "Web3RPCError": "web3.exceptions",
    "REQUEST_RETRY_ALLOWLIST": "web3.providers.rpc.utils",
    "ExceptionRetryConfiguration": "web3.providers.rpc.utils",
    "LogReceipt": "web3.types",
    "PAYMENT_IDENTIFIER": "x402.extensions.payment_identifier",
    "declare_payment_identifier_extension": "x402.extensions.payment_identifier",
    "extract_payment_identifier": "x402.extensions.payment_identifier",
    "hash_eip3009_authorization": "x402.mechanisms.evm.eip712",
    "ExactEIP3009Authorization": "x402.mechanisms.evm.types",
    "verify_eoa_signature": "x402.mechanisms.evm.verify",
    "PaymentPayload": "x402.schemas",
    "PaymentRequired": "x402.schemas",
    "PaymentRequirements": "x402.schemas",
    "ResourceInfo": "x402.schemas",
}
_lock = threading.Lock()


def load() -> None:
    """Imports the lazy names now (the first `sdk.<name>` read does it otherwise). A
    process that imports web3 or eth-account elsewhere first (the test suite's chain
    helpers) calls it before, so py_ecc's import runs here, under the guard."""
    with _lock:
        if "Web3" in globals():
            return
        limit, set_limit = sys.getrecursionlimit(), sys.setrecursionlimit
        setattr(sys, "setrecursionlimit", lambda _limit: None)  # noqa: B010
        try:
            found = {name: getattr(importlib.import_module(m), name) for name, m in LAZY.items()}
        finally:
            setattr(sys, "setrecursionlimit", set_limit)  # noqa: B010
            sys.setrecursionlimit(limit)
        globals().update(found)


def __getattr__(name: str) -> Any:
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    load()
    return globals()[name]


__all__ = [
    "PAYMENT_IDENTIFIER",
    "REQUEST_RETRY_ALLOWLIST",
    "BlockNotFound",
    "ChecksumAddress",
    "Contract",
    "ExactEIP3009Authorization",
    "ExceptionRetryConfiguration",
    "HexAddress",
    "HexBytes",
    "HexStr",
    "LogReceipt",
    "PaymentPayload",
    "PaymentRequired",
    "PaymentRequirements",
    "ResourceInfo",
    "TransactionNotFound",
    "Web3",
    "Web3RPCError",
    "declare_payment_identifier_extension",
    "extract_payment_identifier",
    "hash_eip3009_authorization",
    "verify_eoa_signature",
]
