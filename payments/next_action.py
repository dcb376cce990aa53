"""The one next-action derivation: from stored state, who acts next on a purchase or an
operation, whether anything may be retried, and why.

Every surface renders a `NextStep` and none re-derives it: the REST API's `next_action`
document (`api_action`, below), the MCP tools' instruction and next tool
(agents.tools.operation_guidance / purchase_guidance), the console's "Owner: … / what to
do" (support.selectors.purchase_next_action, which adds what only staff act on through
`staff_next_step`) and the customer page's "Pay again" (payments.customer_copy). A surface
may rename an owner ("finance" for a refund approval) or choose its own words; the
situation, owner and retry advice are decided here once.

Read only, and computed from stored state alone, so a fresh answer, a replay and a later
GET say the same thing about the same state. Imports no recovery module.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from django.conf import settings
from django.utils import timezone

from .enums import (
    NON_RETRYABLE_REASONS,
    OVERTURN_CAUSE,
    PAYMENT_KINDS,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    PurchaseStatus,
    Reason,
    RetryAdvice,
    Stage,
)
from .models import PaymentOperation, Purchase, Quote
from .view_queries import purchase_operations_loaded, retried_by_id

PAYMENT_KIND_VALUES = tuple(k.value for k in PAYMENT_KINDS)


class Situation(str, Enum):
    """What the stored state says; one value per distinct next action."""

    # decided by one operation
    ESCALATED = "escalated"  # reconciliation gave up in time: support owns it
    QUEUED = "queued"  # recorded, not sent yet (outcome pending)
    SENDING = "sending"  # being sent (outcome dispatching)
    UNKNOWN = "unknown"
    AWAITING_PROVIDER = "awaiting_provider"
    AWAITING_BUYER = "awaiting_buyer"
    AWAITING_APPROVAL = "awaiting_approval"
    SUCCEEDED = "succeeded"
    FAILED_RETRIED = "failed_retried"  # follow the retry instead
    # a person's "failed" the provider has not confirmed: money may have moved, so nobody
    # pays again until the provider is read back (payment_create refuses the retry too)
    FAILED_UNCONFIRMED = "failed_unconfirmed"
    FAILED_QUOTE_GONE = "failed_quote_gone"  # a retry needs a new quote
    FAILED_ATTEMPTS_EXHAUSTED = "failed_attempts_exhausted"
    FAILED_INVALID = "failed_invalid"  # the provider refused it as invalid
    FAILED_DECLINED = "failed_declined"  # a retry needs another payment method
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_NOT_PAYMENT = "failed_not_payment"  # a refund/capture/void failed
    # decided by the purchase
    PAYMENT_REQUIRED = "payment_required"
    QUOTE_EXPIRED = "quote_expired"
    UNKNOWN_UNRECORDED = "unknown_unrecorded"  # payment_unknown with no payment to follow
    PAID = "paid"
    COMPLETED = "completed"
    MANUAL_REVIEW = "manual_review"
    REFUND_PENDING = "refund_pending"
    DISPUTED = "disputed"
    DISPUTE_WON = "dispute_won"
    DISPUTE_LOST = "dispute_lost"
    CLOSED = "closed"  # refunded, voided or cancelled
    EXPIRED = "expired"
    # only staff act on these (staff_next_step)
    OVERTURNED = "overturned"  # the provider overturned a person's resolution
    STEPS_NEED_DECISION = "steps_need_decision"


FAILURES = frozenset(s for s in Situation if s.name.startswith("FAILED_"))


@dataclass(frozen=True)
class NextStep:
    situation: Situation
    owner: Owner
    retry: RetryAdvice
    code: str  # the stable code the API publishes
    purchase_id: str
    operation: PaymentOperation | None = None  # the operation it is about, if one
    by_team: bool = False  # the operation's outcome rests on a person, not the provider
    retried_by: str | None = None
    attempts: int | None = None
    steps: tuple[str, ...] = ()  # STEPS_NEED_DECISION: "step (state)" labels

    @property
    def buyer_may_pay_again(self) -> bool:
        """The buyer may start another payment on this purchase (the customer page's
        "Pay again", the MCP retry, the REST `retry_of`)."""
        return (
            self.situation in FAILURES
            and self.owner == Owner.BUYER
            and self.retry == RetryAdvice.NEW_OPERATION
        )


def quote_usable(quote: Quote) -> bool:
    return quote.superseded_at is None and quote.expires_at > timezone.now()


def latest_payment(purchase: Purchase) -> PaymentOperation | None:
    """The payment a purchase's next step follows: its succeeded one, else its latest."""
    loaded = purchase_operations_loaded(purchase)
    if loaded is not None:  # inside purchase_view: the same answer from the one read
        payments = [op for op in loaded if op.kind in PAYMENT_KIND_VALUES]
    else:
        # One read of its payments (a few: PAYMENT_ATTEMPTS_MAX), chosen from below.
        payments = list(purchase.operations.filter(kind__in=PAYMENT_KIND_VALUES))
    succeeded = [op for op in payments if op.outcome == Outcome.SUCCEEDED]
    if succeeded:
        return min(succeeded, key=lambda op: op.pk)
    return max(payments, key=lambda op: (op.created_at, op.pk)) if payments else None


def _payment_attempts(op: PaymentOperation) -> int:
    attempts = getattr(op, "view_payment_attempts", None)  # payments.view_queries
    if attempts is None:
        attempts = op.purchase.operations.filter(kind__in=PAYMENT_KIND_VALUES).count()
    return attempts


_OPEN = {
    Outcome.PENDING: (Situation.QUEUED, Owner.RECONCILIATION),
    Outcome.DISPATCHING: (Situation.SENDING, Owner.RECONCILIATION),
    Outcome.UNKNOWN: (Situation.UNKNOWN, Owner.RECONCILIATION),
    Outcome.AWAITING_PROVIDER: (Situation.AWAITING_PROVIDER, Owner.RECONCILIATION),
    Outcome.AWAITING_BUYER: (Situation.AWAITING_BUYER, Owner.BUYER),
    Outcome.AWAITING_APPROVAL: (Situation.AWAITING_APPROVAL, Owner.SUPPORT),
}
_OPEN_CODES = {
    Situation.UNKNOWN: "payment_unknown",
    Situation.AWAITING_PROVIDER: "awaiting_provider",
    Situation.AWAITING_BUYER: "action_required",
    Situation.AWAITING_APPROVAL: "awaiting_approval",
}


def operation_next_step(op: PaymentOperation) -> NextStep:
    by_team = op.grade == Grade.ACKNOWLEDGED  # words follow the grade

    def step(situation, owner, retry, code, **kw) -> NextStep:
        return NextStep(
            situation,
            Owner(owner),
            RetryAdvice(retry),
            str(code),
            op.purchase_id,
            operation=op,
            by_team=by_team,
            **kw,
        )

    if not op.is_terminal and (op.stage == Stage.ESCALATED or op.escalated_at is not None):
        return step(Situation.ESCALATED, Owner.SUPPORT, RetryAdvice.FORBIDDEN, "escalated")
    if op.outcome in _OPEN:
        situation, owner = _OPEN[op.outcome]
        return step(
            situation,
            owner,
            RetryAdvice.FORBIDDEN,
            _OPEN_CODES.get(situation, f"operation_{op.outcome}"),
        )
    if op.outcome == Outcome.SUCCEEDED:
        return step(Situation.SUCCEEDED, Owner.NONE, RetryAdvice.FORBIDDEN, f"{op.kind}_succeeded")
    reason = op.reason or Reason.PROVIDER_FAILED
    if op.kind not in PAYMENT_KIND_VALUES:
        return step(Situation.FAILED_NOT_PAYMENT, Owner.SUPPORT, RetryAdvice.FORBIDDEN, reason)
    retry_id = retried_by_id(op)
    if retry_id is not None:
        return step(
            Situation.FAILED_RETRIED, Owner.NONE, RetryAdvice.FORBIDDEN, reason, retried_by=retry_id
        )
    if by_team:
        return step(
            Situation.FAILED_UNCONFIRMED,
            Owner.RECONCILIATION,
            RetryAdvice.FORBIDDEN,
            "failure_unconfirmed",
        )
    if not quote_usable(op.purchase.quote):
        return step(Situation.FAILED_QUOTE_GONE, Owner.BUYER, RetryAdvice.NEW_QUOTE, reason)
    attempts = _payment_attempts(op)
    if attempts >= settings.PAYMENT_ATTEMPTS_MAX:
        # Retries converge: a bounded number of attempts, then a person.
        return step(
            Situation.FAILED_ATTEMPTS_EXHAUSTED,
            Owner.SUPPORT,
            RetryAdvice.FORBIDDEN,
            "payment_attempts_exhausted",
            attempts=attempts,
        )
    if reason in NON_RETRYABLE_REASONS:
        return step(Situation.FAILED_INVALID, Owner.BUYER, RetryAdvice.NEW_QUOTE, reason)
    if reason == Reason.CARD_DECLINED:
        return step(Situation.FAILED_DECLINED, Owner.BUYER, RetryAdvice.NEW_OPERATION, reason)
    return step(Situation.FAILED_RETRYABLE, Owner.BUYER, RetryAdvice.NEW_OPERATION, reason)


_FOLLOW_PAYMENT = (
    PurchaseStatus.PAYMENT_PENDING,
    PurchaseStatus.PAYMENT_UNKNOWN,
    PurchaseStatus.ACTION_REQUIRED,
    PurchaseStatus.PAYMENT_FAILED,
)
# status -> (situation, owner, retry, code); code None means the status itself.
_BY_STATUS = {
    PurchaseStatus.PAYMENT_UNKNOWN: (
        Situation.UNKNOWN_UNRECORDED,
        Owner.RECONCILIATION,
        RetryAdvice.FORBIDDEN,
        "payment_unknown",
    ),
    PurchaseStatus.PAID: (Situation.PAID, Owner.NONE, RetryAdvice.FORBIDDEN, "paid"),
    PurchaseStatus.FULFILLING: (Situation.PAID, Owner.NONE, RetryAdvice.FORBIDDEN, "paid"),
    PurchaseStatus.COMPLETED: (Situation.COMPLETED, Owner.NONE, RetryAdvice.FORBIDDEN, "completed"),
    PurchaseStatus.MANUAL_REVIEW: (
        Situation.MANUAL_REVIEW,
        Owner.SUPPORT,
        RetryAdvice.FORBIDDEN,
        "manual_review",
    ),
    PurchaseStatus.REFUND_PENDING: (
        Situation.REFUND_PENDING,
        Owner.RECONCILIATION,
        RetryAdvice.FORBIDDEN,
        "refund_pending",
    ),
    PurchaseStatus.DISPUTED: (Situation.DISPUTED, Owner.SUPPORT, RetryAdvice.FORBIDDEN, "disputed"),
    PurchaseStatus.DISPUTE_WON: (
        Situation.DISPUTE_WON,
        Owner.NONE,
        RetryAdvice.FORBIDDEN,
        "dispute_won",
    ),
    PurchaseStatus.DISPUTE_LOST: (
        Situation.DISPUTE_LOST,
        Owner.NONE,
        RetryAdvice.FORBIDDEN,
        "dispute_lost",
    ),
    PurchaseStatus.REFUNDED: (Situation.CLOSED, Owner.NONE, RetryAdvice.FORBIDDEN, None),
    PurchaseStatus.VOIDED: (Situation.CLOSED, Owner.NONE, RetryAdvice.FORBIDDEN, None),
    PurchaseStatus.CANCELLED: (Situation.CLOSED, Owner.NONE, RetryAdvice.FORBIDDEN, None),
    PurchaseStatus.EXPIRED: (Situation.EXPIRED, Owner.BUYER, RetryAdvice.NEW_QUOTE, "expired"),
}


def purchase_next_step(purchase: Purchase, payment: PaymentOperation | None = None) -> NextStep:
    status = purchase.status
    if payment is None:
        payment = latest_payment(purchase)
    if status == PurchaseStatus.AWAITING_PAYMENT:
        if not quote_usable(purchase.quote):
            return NextStep(
                Situation.QUOTE_EXPIRED,
                Owner.BUYER,
                RetryAdvice.NEW_QUOTE,
                "quote_expired",
                purchase.id,
            )
        return NextStep(
            Situation.PAYMENT_REQUIRED,
            Owner.BUYER,
            RetryAdvice.NEW_OPERATION,
            "payment_required",
            purchase.id,
        )
    if status in _FOLLOW_PAYMENT and payment is not None:
        return operation_next_step(payment)
    if status in _BY_STATUS:
        situation, owner, retry, code = _BY_STATUS[status]
        return NextStep(situation, owner, retry, code or str(status), purchase.id)
    # A payment status with no payment recorded: nothing was charged, so pay.
    return NextStep(
        Situation.PAYMENT_REQUIRED,
        Owner.BUYER,
        RetryAdvice.NEW_OPERATION,
        "payment_required",
        purchase.id,
    )


def staff_next_step(
    purchase: Purchase, ops: list[PaymentOperation], *, steps_needing_decision: tuple[str, ...] = ()
) -> NextStep:
    """What the console shows: an open operation of any kind first (a refund waiting for
    approval is finance's next act even on a completed purchase), then a manual resolution
    the provider overturned, then downstream steps that need a person, then the purchase's
    own step (the API's). `steps_needing_decision`: the console reads the steps (a
    recovery model this module does not import)."""
    for op in ops:
        if op.outcome not in (Outcome.SUCCEEDED, Outcome.FAILED):
            return operation_next_step(op)
    for op in ops:
        if (
            op.is_terminal
            and op.next_action_owner == Owner.SUPPORT
            and op.transitions.filter(cause=OVERTURN_CAUSE).exists()
        ):
            return NextStep(
                Situation.OVERTURNED,
                Owner.SUPPORT,
                RetryAdvice.FORBIDDEN,
                "manual_resolution_overturned",
                purchase.id,
                operation=op,
            )
    refunds = [op for op in ops if op.kind == OperationKind.REFUND]
    latest_refund = max(refunds, key=lambda op: op.created_at, default=None)
    if (
        latest_refund is not None
        and latest_refund.outcome == Outcome.FAILED
        and latest_refund.reason == Reason.PROVIDER_REFUSED
    ):
        # The provider refused the last refund asked for: the customer was promised money
        # that did not move, so "nothing to do" would be false until someone acts.
        return operation_next_step(latest_refund)
    if steps_needing_decision:
        return NextStep(
            Situation.STEPS_NEED_DECISION,
            Owner.SUPPORT,
            RetryAdvice.FORBIDDEN,
            "steps_need_decision",
            purchase.id,
            steps=steps_needing_decision,
        )
    return purchase_next_step(purchase)


# -- the API's rendering: the `next_action` document ------------------------------------

UNKNOWN_MESSAGE = (
    "The payment provider may have applied this payment. Verity is reconciling it with the "
    "provider now. Do not retry and do not create a new payment or a new purchase: that "
    "could charge the customer twice. Poll GET {operation_url} until `outcome` is "
    "`succeeded` or `failed`."
)


def _api_path(path: str) -> str:
    return f"/api/v1/{path}"


def _failed_words(step: NextStep) -> tuple[str, str]:
    # "no money moved" is the provider's word only: a person's "failed" may be overturned.
    if step.by_team:
        failed = (
            "Our team resolved this payment as failed (the provider has not confirmed "
            "it); Verity reads the provider back before any retry."
        )
        return failed, failed
    return "This payment failed; no money moved.", "This payment failed and no money moved."


def api_message(step: NextStep) -> str:
    op = step.operation
    op_url = _api_path(f"operations/{op.id}") if op is not None else ""
    view_url = _api_path(f"purchases/{step.purchase_id}")
    pay_url = _api_path(f"purchases/{step.purchase_id}/payments")
    failed, failed_nothing_moved = _failed_words(step)
    s = Situation
    words = {
        s.ESCALATED: "Reconciliation did not settle this operation in time; support owns it "
        f"now. Do not retry. Poll GET {op_url}.",
        s.QUEUED: f"The operation is being sent to the provider. Do not retry; poll GET {op_url}.",
        s.SENDING: f"The operation is being sent to the provider. Do not retry; poll GET {op_url}.",
        s.UNKNOWN: UNKNOWN_MESSAGE.format(operation_url=op_url),
        s.AWAITING_PROVIDER: "The provider is still processing this operation. Do not retry; "
        f"poll GET {op_url}.",
        s.AWAITING_BUYER: "The buyer must complete an authentication step with the provider. "
        f"Do not create another payment; poll GET {op_url}.",
        s.AWAITING_APPROVAL: "This refund waits for approval by a finance user. Do not "
        f"request it again; poll GET {op_url}.",
        s.SUCCEEDED: (
            "Done; confirmed by our team (the provider has not confirmed it yet, "
            "and its record would overrule). Do not send it again."
            if step.by_team
            else "Done; the provider confirmed this operation. Do not send it again."
        ),
        s.FAILED_RETRIED: f"This payment failed and was already retried as "
        f"{step.retried_by}; follow that operation instead.",
        s.FAILED_UNCONFIRMED: "Our team resolved this payment as failed, but the provider has "
        "not confirmed it, so the buyer may still have been charged. "
        "Do not pay again and do not open a new purchase; "
        f"reconciliation reads the provider back. Poll GET {op_url}.",
        s.FAILED_QUOTE_GONE: f"{failed_nothing_moved} The quote is no longer valid: request a "
        "new quote and create a new purchase.",
        s.FAILED_ATTEMPTS_EXHAUSTED: f"{failed_nothing_moved} This purchase had "
        f"{step.attempts} payment attempts, the most allowed; "
        "support will contact the buyer. Do not retry.",
        s.FAILED_INVALID: "The provider refused this payment as invalid; no money moved. Sent "
        "again unchanged it would fail the same way: ask the buyer for a "
        "different payment method, or request a new quote and create a "
        "new purchase.",
        s.FAILED_DECLINED: "The card was declined; no money moved. To try again, ask the "
        f"buyer for a different payment method and POST {pay_url} with "
        f"retry_of={op.id if op else ''} and a new Idempotency-Key.",
        s.FAILED_RETRYABLE: f"{failed} You may try once more: POST {pay_url} with "
        f"retry_of={op.id if op else ''} and a new Idempotency-Key.",
        s.FAILED_NOT_PAYMENT: f"This {op.kind if op else 'operation'} failed at the provider; "
        "support has been told. Do not retry it yourself.",
        s.PAYMENT_REQUIRED: f"Pay: POST {pay_url} with a new Idempotency-Key.",
        s.QUOTE_EXPIRED: "The quote is no longer valid: request a new quote.",
        s.UNKNOWN_UNRECORDED: UNKNOWN_MESSAGE.format(operation_url=view_url),
        s.PAID: "Paid. Fulfilment is in progress; do not pay again. "
        f"Poll GET {view_url} for the order.",
        s.COMPLETED: "Paid and fulfilled. Nothing to do.",
        s.MANUAL_REVIEW: "Support is reviewing this purchase. Do not pay again and do not "
        f"open a new purchase for it; poll GET {view_url}.",
        s.REFUND_PENDING: f"A refund is in progress. Do not request it again; poll GET {view_url}.",
        s.DISPUTED: "The customer disputed this payment with their bank; finance is handling "
        "it. Do not pay again, do not refund it yourself and do not open a new "
        f"purchase for it; poll GET {view_url}.",
        s.DISPUTE_WON: "A dispute on this payment was decided in the merchant's favour; the "
        "payment stands. Nothing to do.",
        s.DISPUTE_LOST: "A dispute on this payment was decided in the customer's favour; the "
        "bank returned the disputed amount to them (`disputes` in the "
        "purchase view says how much). Do not pay again.",
        s.CLOSED: "This purchase is closed. Nothing to do.",
        s.EXPIRED: "This purchase expired before payment: request a new quote.",
        s.OVERTURNED: "The provider's record overturned a manual resolution; support is "
        f"checking what followed. Do not retry; poll GET {view_url}.",
        s.STEPS_NEED_DECISION: "Support is deciding how fulfilment continues. Do not pay "
        f"again; poll GET {view_url}.",
    }
    return words[step.situation]


def api_action(step: NextStep) -> dict:
    """The `next_action` document of the REST API (and, renamed, of the MCP views)."""
    return {
        "owner": str(step.owner),
        "retry": str(step.retry),
        "code": step.code,
        "message": api_message(step),
    }
