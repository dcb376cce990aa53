"""The x402 rail's adapter (as Saleor's `payment/gateways/<name>/`), one module a concern:

- `adapter.py` — what the rail is and can do (payments.providers.base.RailAdapter);
- `objects.py` — the transfer object, the chain's statuses, the settle words, the drills;
- `facilitator.py` — the facilitator's settle, classified;
- `chain.py` — the read-only chain reader;
- `refunds.py` — the refund signer (a transfer back) and its float;
- `transport.py` — the PAYMENT-* header codec and the signed authorization's checks;
- `auth.py` — the hosted facilitator's credential;
- `sdk.py` — the one import of `web3` and the x402 SDK.

This package is the only Verity code (besides tests and the development chain launchers)
that imports `web3` or the x402 SDK or talks to a facilitator. The rail is registered in
`payments/providers/registry.py`; services reach it through
`payments.services.provider_for(operation)`.
"""

from .adapter import X402Provider, get_provider
from .chain import (
    SEARCH_REORG_MARGIN_BLOCKS,
    ChainMismatch,
    ChainReader,
    ChainView,
    Precheck,
    authorization_transfer,
    chain_call_result,
    get_chain_reader,
    read_refund_transfer,
    transfer_logs,
    transfer_object,
)
from .facilitator import (
    FacilitatorClient,
    FacilitatorUnsupported,
    SettleAnswer,
    classify_settle,
    get_facilitator,
)
from .objects import (
    OBJECT_TYPE,
    USED_ELSEWHERE_REASON,
    ChainStatus,
    DrillMode,
    SettleKind,
    X402Transfer,
)
from .refunds import (
    REFUND_GAS,
    REFUND_NONCE_ATTEMPTS,
    ClaimLost,
    RefundAnswer,
    RefundFloat,
    RefundSender,
    get_refund_sender,
    refund_account_address,
    refund_float,
)
from .transport import (
    PAYMENT_REQUIRED_HEADER,
    PAYMENT_RESPONSE_HEADER,
    PAYMENT_SIGNATURE_HEADER,
    PaymentSignatureInvalid,
    SignedPayment,
    decode_header,
    encode_header,
    forwarded_payload,
    parse_payment_signature,
    payment_required,
    requirements_for,
    settle_response,
    signature_matches,
    signature_refused_by_token,
)

__all__ = [
    "OBJECT_TYPE",
    "authorization_transfer",
    "PAYMENT_REQUIRED_HEADER",
    "PAYMENT_RESPONSE_HEADER",
    "PAYMENT_SIGNATURE_HEADER",
    "REFUND_GAS",
    "REFUND_NONCE_ATTEMPTS",
    "SEARCH_REORG_MARGIN_BLOCKS",
    "USED_ELSEWHERE_REASON",
    "X402Provider",
    "X402Transfer",
    "chain_call_result",
    "ChainMismatch",
    "ChainReader",
    "ChainStatus",
    "ChainView",
    "ClaimLost",
    "classify_settle",
    "decode_header",
    "DrillMode",
    "encode_header",
    "FacilitatorClient",
    "FacilitatorUnsupported",
    "forwarded_payload",
    "get_chain_reader",
    "get_facilitator",
    "get_provider",
    "get_refund_sender",
    "parse_payment_signature",
    "payment_required",
    "PaymentSignatureInvalid",
    "Precheck",
    "read_refund_transfer",
    "refund_account_address",
    "refund_float",
    "RefundAnswer",
    "RefundFloat",
    "RefundSender",
    "requirements_for",
    "settle_response",
    "SettleAnswer",
    "SettleKind",
    "signature_matches",
    "signature_refused_by_token",
    "SignedPayment",
    "transfer_logs",
    "transfer_object",
]
