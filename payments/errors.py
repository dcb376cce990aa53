"""The core's refusal type and the result of applying an observation: a leaf every layer
may import (the API and MCP map `DomainError` to a problem; the relay reads its code)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum

from .enums import Owner, RetryAdvice


class ErrorCode(StrEnum):
    """The stable codes of refusals (DomainError) and problem documents (payments.api.problems):
    what an API client, the MCP tools and the console branch on. A member *is* its string
    (`ErrorCode.NOT_FOUND == "not_found"`, JSON and f-strings give the value), so code that
    still passes or compares a literal keeps working; new code names the member. The values
    are part of the API contract: never rename one, add a new member instead. Members marked
    ACP are the Agentic Commerce Protocol's own names (acp.errors answers them as the spec's
    `Error`); the other faces never answer them."""

    ALREADY_PAID = "already_paid"
    ALREADY_RETRIED = "already_retried"
    ALREADY_REVIEWED = "already_reviewed"
    ALREADY_SETTLED = "already_settled"
    AMOUNT_MISMATCH = "amount_mismatch"
    APPROVER_IS_REQUESTER = "approver_is_requester"
    AUTHORIZATION_EXPIRES_TOO_LATE = "authorization_expires_too_late"
    AUTHORIZATION_EXPIRES_TOO_SOON = "authorization_expires_too_soon"
    AUTHORIZATION_NOT_YET_VALID = "authorization_not_yet_valid"
    AUTHORIZATION_REUSED = "authorization_reused"
    CANCEL_FAILED = "cancel_failed"
    CANCEL_IN_PROGRESS = "cancel_in_progress"
    CANCEL_NOT_ALLOWED = "cancel_not_allowed"
    CHAIN_MISMATCH = "chain_mismatch"
    CHAIN_UNREACHABLE = "chain_unreachable"
    CURRENCY_MISMATCH = "currency_mismatch"
    CURRENCY_NOT_ALLOWED = "currency_not_allowed"
    CUSTOMER_HAS_UNRESOLVED_PURCHASE = "customer_has_unresolved_purchase"
    DATABASE_UNAVAILABLE = "database_unavailable"
    DELIVERABLE_NOT_AVAILABLE = "deliverable_not_available"
    DISPATCH_IN_PROGRESS = "dispatch_in_progress"
    EVENT_NOT_QUARANTINED = "event_not_quarantined"
    FACILITATOR_UNSUPPORTED = "facilitator_unsupported"
    FORBIDDEN_SCOPE = "forbidden_scope"
    FULFILMENT_STARTED = "fulfilment_started"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"  # ACP
    IDEMPOTENCY_IN_FLIGHT = "idempotency_in_flight"  # ACP
    IDEMPOTENCY_KEY_REQUIRED = "idempotency_key_required"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    INTERNAL_ERROR = "internal_error"
    INVALID = "invalid"  # ACP
    INVALID_BUYER_CONFIRMATION = "invalid_buyer_confirmation"
    INVALID_EMAIL = "invalid_email"
    INVALID_ITEMS = "invalid_items"
    INVALID_JSON = "invalid_json"  # ACP
    INVALID_OUTCOME = "invalid_outcome"
    INVALID_PAYMENT_METHOD = "invalid_payment_method"
    INVALID_QUANTITY = "invalid_quantity"
    INVALID_REQUEST = "invalid_request"
    INVALID_SIGNATURE = "invalid_signature"  # ACP
    METHOD_NOT_ALLOWED = "method_not_allowed"
    MISSING = "missing"  # ACP
    MISSING_API_VERSION = "missing_api_version"  # ACP
    NOT_ACCEPTABLE = "not_acceptable"
    NOT_AWAITING_APPROVAL = "not_awaiting_approval"
    NOT_CANCELABLE = "not_cancelable"  # ACP
    NOT_CANCELLABLE = "not_cancellable"
    NOT_CAPTURABLE = "not_capturable"
    NOT_DISPATCHED = "not_dispatched"
    NOT_EXTERNAL = "not_external"
    NOT_FOUND = "not_found"
    NOT_OVERTURNED = "not_overturned"
    NOT_REFUNDABLE = "not_refundable"
    NOT_REPLAYABLE = "not_replayable"
    NOT_RESOLVABLE = "not_resolvable"
    ORIGINAL_SUCCEEDED = "original_succeeded"
    ORIGINAL_UNVERIFIED = "original_unverified"
    OUT_OF_STOCK = "out_of_stock"
    PAYMENT_ATTEMPTS_EXHAUSTED = "payment_attempts_exhausted"
    PAYMENT_DECLINED = "payment_declined"  # ACP
    PAYMENT_FAILED = "payment_failed"
    PAYMENT_IDENTIFIER_REUSED = "payment_identifier_reused"
    PAYMENT_REQUIRED = "payment_required"
    PAYMENT_REQUIREMENTS_MISMATCH = "payment_requirements_mismatch"
    PAYMENT_SIGNATURE_INVALID = "payment_signature_invalid"
    PAYMENT_UNRESOLVED = "payment_unresolved"
    PRICE_CHANGED = "price_changed"  # ACP
    PROBABLE_DUPLICATE_PURCHASE = "probable_duplicate_purchase"
    PROVIDER_APPLIED = "provider_applied"
    PROVIDER_CANCEL_FAILED = "provider_cancel_failed"
    PROVIDER_CONTRADICTS = "provider_contradicts"
    PROVIDER_PROCESSING = "provider_processing"
    PROVIDER_UNAVAILABLE = "provider_unavailable"  # ACP
    QUANTITY_EXCEEDED = "quantity_exceeded"  # ACP
    QUOTE_EXPIRED = "quote_expired"
    QUOTE_NOT_FOUND = "quote_not_found"
    QUOTE_SUPERSEDED = "quote_superseded"
    RAIL_NOT_AVAILABLE = "rail_not_available"
    RATE_LIMITED = "rate_limited"
    REASON_REQUIRED = "reason_required"
    REFUND_EXCEEDS_REFUNDABLE = "refund_exceeds_refundable"
    REPLAY_UNSUPPORTED = "replay_unsupported"
    REPLAY_WINDOW_CLOSED = "replay_window_closed"
    REPLAYER_IS_REQUESTER = "replayer_is_requester"
    REQUEST_IN_PROGRESS = "request_in_progress"
    REQUEST_TOO_LARGE = "request_too_large"
    RESOLVER_IS_REQUESTER = "resolver_is_requester"
    RETRY_NEEDS_NEW_METHOD = "retry_needs_new_method"
    RETRY_NOT_ALLOWED = "retry_not_allowed"
    RETRY_OF_NOT_FOUND = "retry_of_not_found"
    RETRY_OF_REQUIRED = "retry_of_required"
    SESSION_NOT_COMPLETABLE = "session_not_completable"  # ACP
    SESSION_NOT_READY = "session_not_ready"  # ACP
    SESSION_NOT_UPDATABLE = "session_not_updatable"  # ACP
    SHARED_PAYMENT_GRANTED_TOKEN_CONSUMED = "shared_payment_granted_token_consumed"
    SHARED_PAYMENT_GRANTED_TOKEN_EXPIRED = "shared_payment_granted_token_expired"
    SHARED_PAYMENT_GRANTED_TOKEN_USAGE_LIMIT_EXCEEDED = (
        "shared_payment_granted_token_usage_limit_exceeded"
    )
    SPENDING_LIMIT_EXCEEDED = "spending_limit_exceeded"
    UNAUTHENTICATED = "unauthenticated"
    UNKNOWN_FIELD = "unknown_field"
    UNKNOWN_SKU = "unknown_sku"
    UNSUPPORTED_API_VERSION = "unsupported_api_version"  # ACP
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    WORKFLOW_HALTED = "workflow_halted"
    X402_HAS_NO_VOID = "x402_has_no_void"
    X402_REFUND_SIGNER_MISSING = "x402_refund_signer_missing"
    X402_SETTLE_RATE_LIMITED = "x402_settle_rate_limited"


@dataclass
class DomainError(Exception):
    """A refusal with a stable code (an ErrorCode; a plain string of the same value is
    accepted). Raised before any effect unless stated."""

    code: ErrorCode | str
    message: str
    status: int = 409
    retry: str = RetryAdvice.FORBIDDEN
    owner: str = Owner.BUYER
    purchase: str | None = None
    operation: str | None = None
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ApplyResult(str, Enum):
    APPLIED = "applied"
    NO_CHANGE = "no_change"
    STALE = "stale"
    CONFLICT = "conflict"
    MISMATCH = "mismatch"
