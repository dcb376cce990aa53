"""web3 and the x402 SDK: the one place the rail imports them from.

py_ecc (imported by web3/eth-account) raises the interpreter's recursion limit to 100000
at import. Deeply nested JSON would then overflow the C stack instead of raising
RecursionError, which the API and webhook parsers turn into a 400
(tests/api/test_hostile_input.py). The imports below keep the interpreter's own limit.
"""

from __future__ import annotations

import sys

_RECURSION_LIMIT = sys.getrecursionlimit()
try:
    from eth_typing import ChecksumAddress, HexAddress, HexStr
    from hexbytes import HexBytes
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
finally:
    sys.setrecursionlimit(_RECURSION_LIMIT)

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
