"""Stable vocabularies. The string values are part of the API and never change."""

from django.db import models


class OperationKind(models.TextChoices):
    CHARGE = "charge"
    AUTHORIZE = "authorize"
    CAPTURE = "capture"
    VOID = "void"
    REFUND = "refund"


# Kinds that bring money in (a purchase may have at most one of these succeed).
PAYMENT_KINDS = (OperationKind.CHARGE, OperationKind.AUTHORIZE)


class Rail(models.TextChoices):
    """How a payment moves: Stripe (cards), or x402 (`exact` EIP-3009 on an EVM chain)."""

    STRIPE = "stripe"
    X402 = "x402"


class Outcome(models.TextChoices):
    PENDING = "pending"
    DISPATCHING = "dispatching"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    AWAITING_PROVIDER = "awaiting_provider"
    AWAITING_BUYER = "awaiting_buyer"
    AWAITING_APPROVAL = "awaiting_approval"


TERMINAL_OUTCOMES = (Outcome.SUCCEEDED, Outcome.FAILED)
# Why an event about money the provider moved (an external refund, a dispute) is held while
# Verity's own record of that money is not settled yet: it waits as long as the record does
# (the reconciler settles it), never quarantined for it (webhooks.services).
OWN_RECORD_UNSETTLED = ("payment_not_settled", "capture_not_settled")
# Outcomes that hold the purchase's slot: no other money movement may start meanwhile.
SLOT_HOLDING_OUTCOMES = (
    Outcome.PENDING,
    Outcome.DISPATCHING,
    Outcome.UNKNOWN,
    Outcome.AWAITING_PROVIDER,
    Outcome.AWAITING_BUYER,
)


class Stage(models.TextChoices):
    QUEUED = "queued"
    DISPATCHING = "dispatching"
    RECONCILING = "reconciling"
    SETTLED = "settled"
    ESCALATED = "escalated"


class Grade(models.TextChoices):
    NONE = ""
    CONFIRMED = "confirmed"
    ACKNOWLEDGED = "acknowledged"


class Verification(models.TextChoices):
    UNVERIFIED = "unverified"
    PROVIDER = "provider"
    WEBHOOK = "webhook"
    MANUAL = "manual"


class PurchaseStatus(models.TextChoices):
    AWAITING_PAYMENT = "awaiting_payment"
    PAYMENT_PENDING = "payment_pending"
    PAYMENT_UNKNOWN = "payment_unknown"
    PAYMENT_FAILED = "payment_failed"
    ACTION_REQUIRED = "action_required"
    PAID = "paid"
    FULFILLING = "fulfilling"
    COMPLETED = "completed"
    MANUAL_REVIEW = "manual_review"
    REFUND_PENDING = "refund_pending"
    REFUNDED = "refunded"
    VOIDED = "voided"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    # A dispute (chargeback) is open at the provider; then how it ended.
    DISPUTED = "disputed"
    DISPUTE_WON = "dispute_won"
    DISPUTE_LOST = "dispute_lost"


# A customer with a purchase in one of these cannot silently start another one.
UNRESOLVED_STATUSES = (
    PurchaseStatus.PAYMENT_PENDING,
    PurchaseStatus.PAYMENT_UNKNOWN,
    PurchaseStatus.ACTION_REQUIRED,
    PurchaseStatus.MANUAL_REVIEW,
)


# "Money is held" (one definition for every guard that asks it): the statuses
# in which the buyer's money sits with the merchant: paid and on, a refund still in flight
# (it may yet fail and restore the purchase), a dispute open (the bank may give the money
# back to the merchant) or won. Refunded, voided, lost, failed, cancelled and expired
# purchases hold nothing.
MONEY_HELD_STATUSES = (
    PurchaseStatus.PAID,
    PurchaseStatus.FULFILLING,
    PurchaseStatus.COMPLETED,
    PurchaseStatus.REFUND_PENDING,
    PurchaseStatus.DISPUTED,
    PurchaseStatus.DISPUTE_WON,
)
# A later purchase for the same buyer and basket is a probable duplicate of one whose money
# is held, or may be (unresolved).
DUPLICATE_GUARD_STATUSES = (*MONEY_HELD_STATUSES, *UNRESOLVED_STATUSES)


class Owner(models.TextChoices):
    BUYER = "buyer"
    RECONCILIATION = "reconciliation"
    SUPPORT = "support"
    NONE = "none"


class RetryAdvice(models.TextChoices):
    FORBIDDEN = "forbidden"
    SAME_KEY = "same_key"
    NEW_OPERATION = "new_operation"
    NEW_QUOTE = "new_quote"


class CallPurpose(models.TextChoices):
    DISPATCH = "dispatch"
    RECONCILE = "reconcile"
    REPLAY = "replay"


class CallStep(models.TextChoices):
    CREATE = "create"
    CONFIRM = "confirm"
    # One round trip: create with confirm=true, where the provider dedupes keys
    # (docs/reliability.md#one-round-trip-where-the-provider-dedupes-keys).
    PAY = "pay"
    CAPTURE = "capture"
    CANCEL = "cancel"
    REFUND = "refund"
    RETRIEVE = "retrieve"
    LIST = "list"
    SETTLE = "settle"  # x402: the facilitator's settle (the one write of the rail)


class Classification(models.TextChoices):
    """How one provider request ended (a ProviderCall result, not an outcome)."""

    OK = "ok"
    DECLINED = "declined"
    REJECTED = "rejected"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"
    RETRYABLE = "retryable"
    NOT_FOUND = "not_found"
    IN_FLIGHT = "in_flight"


class HoldState(models.TextChoices):
    RESERVED = "reserved"
    CONSUMED = "consumed"
    RELEASED = "released"


class LimitPeriod(models.TextChoices):
    NONE = "none"
    DAY = "day"
    MONTH = "month"


class Reason(models.TextChoices):
    """Stable failure reason codes."""

    CARD_DECLINED = "card_declined"
    INVALID_REQUEST = "invalid_request"
    NOT_CONFIRMED = "not_confirmed"
    PROVIDER_UNREACHABLE = "provider_unreachable"
    PROVIDER_CANCELED = "provider_canceled"
    PROVIDER_FAILED = "provider_failed"
    MANUAL = "manual"
    MISMATCH = "mismatch"
    REFUND_DECLINED = "refund_declined"
    # x402 (docs/x402.md#reconciled-from-the-chain-only): the chain proves the authorization can
    # no longer move money.
    AUTHORIZATION_EXPIRED = "authorization_expired"
    AUTHORIZATION_CANCELED = "authorization_canceled"
    # x402: the payer's nonce was used by a transaction that paid Verity nothing
    # (EIP-3009 nonces are shared by all of the payer's transfers): never a payment.
    AUTHORIZATION_USED_ELSEWHERE = "authorization_used_elsewhere"
    # x402: a succeeded payment's transfer left the chain before its block was final (a
    # reorg) and the authorization can no longer move money (cancelled, used elsewhere,
    # expired): the payment that was counted never happened (payments.services.x402_finality).
    TRANSFER_REVERSED_ON_CHAIN = "transfer_reversed_on_chain"
    # x402: the facilitator's verify refused the authorization (invalid_* reasons).
    AUTHORIZATION_INVALID = "authorization_invalid"
    INSUFFICIENT_BALANCE = "insufficient_balance"
    # A refund (or void) the provider refused with a definitive 4xx (already refunded,
    # disputed, ...) and of which a read-back finds no object: nothing moved. The
    # provider's own code is kept in the transition's evidence.
    PROVIDER_REFUSED = "provider_refused"


# A failed payment with one of these reasons will fail the same way if sent again
# unchanged: the answer advises a different payment method or a new quote, never "retry".
NON_RETRYABLE_REASONS = (Reason.INVALID_REQUEST, Reason.MISMATCH, Reason.AUTHORIZATION_INVALID)


class Origin(models.TextChoices):
    """Who started a money movement: Verity, or the provider (a dashboard refund, a capture
    or cancel made outside Verity) -- recorded as an external linked operation."""

    VERITY = "verity"
    PROVIDER = "provider"


class DisputeStatus(models.TextChoices):
    """Stripe's Dispute.status values (stable strings)."""

    WARNING_NEEDS_RESPONSE = "warning_needs_response"
    WARNING_UNDER_REVIEW = "warning_under_review"
    WARNING_CLOSED = "warning_closed"
    NEEDS_RESPONSE = "needs_response"
    UNDER_REVIEW = "under_review"
    WON = "won"
    LOST = "lost"
    CHARGE_REFUNDED = "charge_refunded"


# The lifecycle only moves forward: an event or read-back whose status ranks lower than
# the stored one is stale (events arrive out of order) and never regresses the record.
DISPUTE_STATUS_RANK = {
    DisputeStatus.WARNING_NEEDS_RESPONSE: 0,
    DisputeStatus.WARNING_UNDER_REVIEW: 1,
    DisputeStatus.NEEDS_RESPONSE: 2,
    DisputeStatus.UNDER_REVIEW: 3,
    DisputeStatus.WARNING_CLOSED: 4,
    DisputeStatus.WON: 4,
    DisputeStatus.LOST: 4,
    DisputeStatus.CHARGE_REFUNDED: 4,
}
DISPUTE_CLOSED_STATUSES = (
    DisputeStatus.WARNING_CLOSED,
    DisputeStatus.WON,
    DisputeStatus.LOST,
    DisputeStatus.CHARGE_REFUNDED,
)
# A chargeback open or lost: the buyer's bank holds the disputed amount (the provider
# refuses a refund of it; a lost one already returned it). An inquiry (warning_*) moves no
# funds; a won dispute reinstated them; `charge_refunded` closed on a refund (counted as
# the refund it is).
DISPUTE_FUNDS_WITH_BANK_STATUSES = (
    DisputeStatus.NEEDS_RESPONSE,
    DisputeStatus.UNDER_REVIEW,
    DisputeStatus.LOST,
)
# Open disputes that still wait for the merchant's evidence (the finance queue's urgency).
DISPUTE_NEEDS_RESPONSE_STATUSES = (
    DisputeStatus.WARNING_NEEDS_RESPONSE,
    DisputeStatus.NEEDS_RESPONSE,
)
# The history cause of a transition where verified provider evidence overturned a
# person's (acknowledged) resolution
# (docs/reliability.md#the-providers-record-outranks-a-person): queues, metrics and alerts key
# on it.
OVERTURN_CAUSE = "manual_resolution_overturned"
