"""The one source of customer-facing words.

The customer status page, the API's `customer_message` and the console's customer view
all call `customer_state(purchase)`, so what a customer reads can never contradict what
support sees. The rules:

- Never imply a success or failure Verity has not verified: an `unknown` payment is
  "checking with the provider", not "failed"; a refund is "reversed" only once the
  provider has confirmed it (a refund operation that succeeded, or that the provider
  reported as processing).
- Never promise a settlement date (banks decide how long a refund takes to appear).
- "Pay again" is offered only when the last payment definitively failed and
  payments.next_action lets the buyer pay again (the API's `new_operation`); the page
  and the pay-again endpoint ask `can_pay_again` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from django.conf import settings

from recovery.models import Order

from .enums import (
    PAYMENT_KINDS,
    Grade,
    OperationKind,
    Outcome,
    PurchaseStatus,
    Rail,
    Verification,
)
from .models import PaymentOperation, Purchase
from .money import format_money
from .next_action import Situation, purchase_next_step
from .selectors import purchase_money
from .view_queries import purchase_operations_loaded, purchase_order_reference


class StateCode:
    BEING_CONFIRMED = "being_confirmed"
    PAYMENT_PENDING = "payment_pending"
    PAID_CONFIRMATION_DELAYED = "paid_confirmation_delayed"
    NOT_YET_CONFIRMABLE = "not_yet_confirmable"
    FAILED = "failed"
    REVERSED = "reversed"
    COMPLETE = "complete"
    UNDER_REVIEW = "under_review"
    AWAITING_PAYMENT = "awaiting_payment"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    DISPUTED = "disputed"
    DISPUTE_WON = "dispute_won"
    DISPUTE_LOST = "dispute_lost"

    ALL = (
        BEING_CONFIRMED,
        PAYMENT_PENDING,
        PAID_CONFIRMATION_DELAYED,
        NOT_YET_CONFIRMABLE,
        FAILED,
        REVERSED,
        COMPLETE,
        UNDER_REVIEW,
        AWAITING_PAYMENT,
        CANCELLED,
        EXPIRED,
        DISPUTED,
        DISPUTE_WON,
        DISPUTE_LOST,
    )


@dataclass(frozen=True)
class CustomerState:
    code: str
    headline: str
    message: str
    can_pay_again: bool = False
    pay_again_url: str | None = None
    final: bool = False
    order_reference: str | None = None
    support_contact: str = ""
    returning: int | None = None  # minor units on their way back to the buyer (reversed)

    def as_dict(self) -> dict:
        return {
            "code": self.code,
            "headline": self.headline,
            "message": self.message,
            "can_pay_again": self.can_pay_again,
            "final": self.final,
            "order_reference": self.order_reference,
            "support_contact": self.support_contact,
        }


# The fixed customer wording per state, used by customer_state() below and quoted (never
# copied) by the support runbooks (support/runbooks.py renders `[[customer:<key>]]`).
# Placeholders: {contact}, {ref} (order reference).
WORDS: dict[str, tuple[str, str]] = {
    "under_review": (
        "A person is reviewing your purchase",
        "Our support team is reviewing this purchase. Please do not pay again. "
        "If you have questions, contact {contact} and quote your purchase reference.",
    ),
    "not_yet_confirmable": (
        "We are checking your payment",
        "We could not yet confirm whether your payment went through, so we are "
        "checking with the payment provider. Please do not pay again.",
    ),
    "being_confirmed": (
        "Your payment is being confirmed",
        "Your payment has been sent to the payment provider and is being confirmed. "
        "Please do not pay again.",
    ),
    "paid_confirmation_delayed": (
        "Payment received — order confirmation in progress",
        "Your payment was received. We are still finishing your order and "
        "will show the order reference here; you do not need to pay again.",
    ),
    "paid_confirmation_delayed_with_order": (
        "Payment received — order confirmation in progress",
        "Your payment was received. Your order reference is {ref}. "
        "The order confirmation is taking longer than usual; you do not need "
        "to pay again.",
    ),
    "reversed": (
        "Your payment has been reversed",
        "The payment provider has confirmed that your payment is being returned "
        "to your payment method. How long it takes to appear depends on your bank. "
        "You do not need to do anything.",
    ),
    # Disputes: plain words, never an invitation to pay again (the money is with the bank).
    "disputed": (
        "Your payment is being reviewed with your bank",
        "Your bank told us you questioned this payment, so it is being reviewed between "
        "your bank and us. Please do not pay again. Your bank will tell you the result; "
        "if you have questions, contact {contact} and quote your purchase reference.",
    ),
    "dispute_won": (
        "The review with your bank is finished",
        "Your bank's review of this payment is finished and the payment stands. "
        "You do not need to pay again. If you have questions, contact {contact}.",
    ),
    "dispute_lost": (
        "Your bank returned this payment to you",
        "Your bank's review of this payment is finished and your bank has returned the "
        "money to you. You do not need to do anything, and please do not pay again.",
    ),
    # A chargeback of part of the payment, lost: the rest stays paid, the order stands.
    "dispute_lost_partial": (
        "Your bank returned part of this payment to you",
        "Your bank's review of this payment is finished and your bank has returned "
        "{amount} to you; the rest of the payment stands and your order goes ahead. You do "
        "not need to do anything. If you have questions, contact {contact}.",
    ),
    # A person (grade acknowledged) is never presented as the provider
    # (docs/reliability.md#the-providers-record-outranks-a-person).
    "reversed_by_team": (
        "Your payment has been reversed",
        "Our team has confirmed that your payment is being returned to your payment "
        "method. How long it takes to appear depends on your bank. "
        "You do not need to do anything.",
    ),
    "failed_unconfirmed": (
        "We are confirming your payment with the payment provider",
        "Our team found that this payment did not go through, and is confirming it with the "
        "payment provider. Please do not pay again yet: if you were charged, the order "
        "goes ahead or the money is returned. If you have questions, contact {contact} and "
        "quote your purchase reference.",
    ),
    "failed": (
        "Your payment did not go through",
        "The payment provider declined or did not take this payment, so no order was "
        "placed. You may try again, for example with another payment method.",
    ),
    "failed_attempts_exhausted": (
        "Your payment did not go through",
        "The payment provider declined or did not take this payment, so no order was "
        "placed. This purchase has had the most payment attempts allowed, so please do not "
        "pay again here: our support team will contact you. If you have questions, contact "
        "{contact}.",
    ),
    "failed_start_new": (
        "Your payment did not go through",
        "The payment provider did not take this payment, so no order was placed. Paying "
        "again the same way would not work: to try again, please start a new purchase at "
        "the store, for example with another payment method.",
    ),
}


def wording(key: str, **values) -> tuple[str, str]:
    """(headline, message) for a WORDS key; missing placeholders stay visible as ‹name›."""
    headline, message = WORDS[key]
    fill = {"contact": "‹support contact›", "ref": "‹order reference›", **values}
    return headline, message.format(**fill)


# Money-in operations a customer can be told about; refunds/voids handled separately.
_PAYMENT_KIND_VALUES = tuple(k.value for k in PAYMENT_KINDS)
_PROVIDER_EVIDENCE = (Verification.PROVIDER.value, Verification.WEBHOOK.value)


def _order_reference(purchase_id: str) -> str | None:
    return Order.objects.filter(purchase_id=purchase_id).values_list("reference", flat=True).first()


def _pay_again_url(purchase_id: str) -> str | None:
    template = getattr(settings, "STOREFRONT_CHECKOUT_URL", "") or ""
    if "{purchase_id}" not in template:
        return None
    return template.replace("{purchase_id}", quote(purchase_id, safe=""))


@dataclass(frozen=True)
class _Reversal:
    amount: int  # confirmed by the provider or by our team (minor units)
    processing: bool  # some confirmed reversal is still processing at the provider
    full: bool
    by_team: bool = False  # part of it rests on a person's resolution, not the provider


def _reversal_confirmed(ops: list, purchase_amount: int) -> _Reversal | None:
    """What the provider has confirmed about refunds/voids, or None.

    Only the provider's own record counts: a refund waiting for approval, pending, or
    unknown is not shown to the customer as a reversal.
    """
    amount, processing, void, by_team = 0, False, False, False
    for op in ops:
        if op.kind not in (OperationKind.REFUND.value, OperationKind.VOID.value):
            continue
        if op.parent_id and getattr(op.parent, "is_duplicate", False):
            continue  # the return of a duplicate charge is not a reversal of the purchase
        if op.outcome == Outcome.SUCCEEDED.value:
            by_team = by_team or op.grade == Grade.ACKNOWLEDGED.value
        elif (
            op.outcome == Outcome.AWAITING_PROVIDER.value
            and op.provider_reference
            and op.verification in _PROVIDER_EVIDENCE
        ):
            processing = True
        else:
            continue
        if op.kind == OperationKind.VOID.value:
            void = True
        amount += op.amount
    if amount == 0 and not void:
        return None
    return _Reversal(
        amount=amount,
        processing=processing,
        full=void or amount >= purchase_amount,
        by_team=by_team,
    )


# -- the rule table ------------------------------------------------------------------
#
# customer_state() reads the purchase once into `_Facts`, then asks each rule in RULES in
# order; the first whose `when` holds gives the state. The order is the policy: a dispute
# outranks a confirmed reversal, which outranks "complete", and so on down to "a person is
# looking at it" for any combination no rule claims (never a success we cannot point at).

_REVERSIBLE_STATUSES = (
    PurchaseStatus.REFUND_PENDING,
    PurchaseStatus.REFUNDED,
    PurchaseStatus.VOIDED,
    PurchaseStatus.CANCELLED,
    PurchaseStatus.MANUAL_REVIEW,
    PurchaseStatus.PAID,
    PurchaseStatus.FULFILLING,
    PurchaseStatus.COMPLETED,
)
_PAID_OR_AFTER = (
    PurchaseStatus.PAID,
    PurchaseStatus.FULFILLING,
    PurchaseStatus.COMPLETED,
    PurchaseStatus.REFUND_PENDING,
    PurchaseStatus.REFUNDED,
    PurchaseStatus.VOIDED,
)
_DISPUTES: dict[str, tuple[str, str, bool]] = {
    PurchaseStatus.DISPUTED: (StateCode.DISPUTED, "disputed", False),
    PurchaseStatus.DISPUTE_WON: (StateCode.DISPUTE_WON, "dispute_won", True),
    PurchaseStatus.DISPUTE_LOST: (StateCode.DISPUTE_LOST, "dispute_lost", True),
}
_IN_FLIGHT = (Outcome.PENDING.value, Outcome.DISPATCHING.value, Outcome.AWAITING_PROVIDER.value)
_ON_CHAIN_UNSETTLED = (
    Outcome.UNKNOWN.value,
    Outcome.AWAITING_PROVIDER.value,
    Outcome.DISPATCHING.value,
)
_BANK = "How long it takes to appear depends on your bank. You do not need to do anything."


@dataclass(frozen=True)
class _Facts:
    """What the rules may look at, read once from stored state."""

    purchase: Purchase
    status: str
    last_payment: PaymentOperation | None  # the latest non-duplicate payment
    paid: bool  # some non-duplicate payment succeeded
    reversal: _Reversal | None
    contact: str

    @property
    def last_outcome(self) -> str | None:
        return self.last_payment.outcome if self.last_payment is not None else None

    def state(self, code: str, headline: str, message: str, **kw) -> CustomerState:
        return CustomerState(
            code=code, headline=headline, message=message, support_contact=self.contact, **kw
        )

    def order_reference(self) -> str | None:
        return purchase_order_reference(self.purchase, _order_reference)


def _facts(purchase) -> _Facts:
    ops = purchase_operations_loaded(purchase)  # read once by payments.api.presenters.purchase_view
    if ops is None:
        ops = list(purchase.operations.select_related("parent").order_by("created_at", "id"))
    # A duplicate charge is not the purchase's payment (its own compensation returns it).
    payments = [op for op in ops if op.kind in _PAYMENT_KIND_VALUES and not op.is_duplicate]
    return _Facts(
        purchase=purchase,
        status=purchase.status,
        last_payment=payments[-1] if payments else None,
        paid=any(op.outcome == Outcome.SUCCEEDED.value for op in payments),
        reversal=_reversal_confirmed(ops, purchase.amount),
        contact=getattr(settings, "SUPPORT_CONTACT", ""),
    )


@dataclass(frozen=True)
class Rule:
    name: str
    when: Callable[[_Facts], bool]
    then: Callable[[_Facts], CustomerState]


def _under_review(f: _Facts) -> CustomerState:
    return f.state(StateCode.UNDER_REVIEW, *wording("under_review", contact=f.contact))


def _disputed(f: _Facts) -> CustomerState:
    # The money is with the customer's bank: never an invitation to pay again.
    code, key, final = _DISPUTES[f.status]
    if f.status == PurchaseStatus.DISPUTE_LOST:
        money = purchase_money(f.purchase.id)
        if 0 < money.dispute_lost_amount and not money.returned:
            amount = format_money(money.dispute_lost_amount, f.purchase.currency)
            return f.state(
                code,
                *wording("dispute_lost_partial", contact=f.contact, amount=amount),
                final=final,
            )
    return f.state(code, *wording(key, contact=f.contact), final=final)


def _reversed(f: _Facts) -> CustomerState:
    reversal = f.reversal
    assert reversal is not None  # both rules that answer this check it
    if not reversal.full:
        amount = format_money(reversal.amount, f.purchase.currency)
        still = " and is processing it" if reversal.processing else ""
        who = "Our team has" if reversal.by_team else "The payment provider has"
        return f.state(
            StateCode.REVERSED,
            "Part of your payment is being refunded",
            f"{who} confirmed a refund of {amount} to your payment method{still}. {_BANK}",
            final=not reversal.processing,
            returning=reversal.amount,
        )
    if not reversal.processing:
        key = "reversed_by_team" if reversal.by_team else "reversed"
        return f.state(StateCode.REVERSED, *wording(key), final=True, returning=reversal.amount)
    return f.state(
        StateCode.REVERSED,
        "Your refund is processing",
        f"The payment provider has accepted a refund of your payment and is processing it. {_BANK}",
        returning=reversal.amount,
    )


def _complete(f: _Facts) -> CustomerState:
    ref = f.order_reference()
    msg = "Your payment was received and your order is complete."
    if ref:
        msg = f"Your payment was received and your order {ref} is complete."
    return f.state(
        StateCode.COMPLETE, "Your order is complete", msg, final=True, order_reference=ref
    )


def _paid_order_pending(f: _Facts) -> CustomerState:
    # REFUND_PENDING without provider evidence: the customer was paid-and-ordered as far
    # as anyone can verify; a refund is only announced once the provider has it.
    ref = f.order_reference()
    key = "paid_confirmation_delayed_with_order" if ref else "paid_confirmation_delayed"
    return f.state(StateCode.PAID_CONFIRMATION_DELAYED, *wording(key, ref=ref), order_reference=ref)


def _on_chain(f: _Facts) -> CustomerState:
    # A transfer on a chain: broadcast, its confirmation not seen yet.
    auth = getattr(f.last_payment, "x402", None)
    network = auth.network if auth is not None else "the network"
    return f.state(
        StateCode.BEING_CONFIRMED,
        "Your payment is waiting for confirmation",
        f"Your payment was sent and is waiting for confirmation on {network}. Don't pay again.",
    )


def _awaiting_buyer(f: _Facts) -> CustomerState:
    return f.state(
        StateCode.PAYMENT_PENDING,
        "Your payment needs one more step",
        "Your bank or card issuer asked for an extra confirmation at the store's "
        "checkout. Nothing has been confirmed yet. Please finish that step there "
        "rather than starting a new payment.",
    )


def _failed(f: _Facts) -> CustomerState:
    # "Pay again" is offered exactly when payments.next_action lets the buyer start another
    # payment on this purchase (the API's retry advice `new_operation`): never on an
    # expired quote, after the last allowed attempt, or where the same payment would be
    # refused again.
    step = purchase_next_step(f.purchase, f.last_payment)
    if step.situation == Situation.FAILED_QUOTE_GONE:
        return f.state(
            StateCode.FAILED,
            "Your payment did not go through",
            "The payment provider declined or did not take this payment, so no "
            "order was placed. The price for this purchase has since expired: to "
            "try again, please start a new purchase at the store.",
        )
    if step.situation == Situation.FAILED_ATTEMPTS_EXHAUSTED:
        return f.state(StateCode.FAILED, *wording("failed_attempts_exhausted", contact=f.contact))
    if step.situation == Situation.FAILED_UNCONFIRMED:
        return f.state(StateCode.UNDER_REVIEW, *wording("failed_unconfirmed", contact=f.contact))
    if not step.buyer_may_pay_again:
        return f.state(StateCode.FAILED, *wording("failed_start_new"))
    url = _pay_again_url(f.purchase.id)
    return f.state(
        StateCode.FAILED, *wording("failed"), can_pay_again=url is not None, pay_again_url=url
    )


P = PurchaseStatus  # short, for the table below

RULES: tuple[Rule, ...] = (
    # A dispute won after the whole payment was returned (a compensation refund, say):
    # "the payment stands" would be untrue for the buyer, whose money came back.
    Rule(
        "dispute won, returned in full",
        lambda f: (
            f.status == P.DISPUTE_WON
            and f.reversal is not None
            and f.reversal.full
            and not f.reversal.processing
        ),
        _reversed,
    ),
    Rule("dispute", lambda f: f.status in _DISPUTES, _disputed),
    Rule(
        "reversal confirmed",
        lambda f: f.reversal is not None and f.status in _REVERSIBLE_STATUSES,
        _reversed,
    ),
    Rule("complete", lambda f: f.status == P.COMPLETED and f.paid, _complete),
    Rule(
        "paid, order in progress",
        lambda f: f.paid and f.status in (P.PAID, P.FULFILLING, P.REFUND_PENDING),
        _paid_order_pending,
    ),
    # Includes inconsistent combinations (e.g. paid without a succeeded payment): never
    # show success we cannot point at.
    Rule(
        "review or unprovable success",
        lambda f: f.status == P.MANUAL_REVIEW or f.status in _PAID_OR_AFTER,
        _under_review,
    ),
    Rule(
        "on chain, unconfirmed",
        lambda f: (
            f.last_payment is not None
            and f.last_payment.rail == Rail.X402
            and f.last_outcome in _ON_CHAIN_UNSETTLED
        ),
        _on_chain,
    ),
    Rule(
        "unknown",
        lambda f: f.last_outcome == Outcome.UNKNOWN.value,
        lambda f: f.state(StateCode.NOT_YET_CONFIRMABLE, *wording("not_yet_confirmable")),
    ),
    Rule(
        "awaiting buyer", lambda f: f.last_outcome == Outcome.AWAITING_BUYER.value, _awaiting_buyer
    ),
    Rule(
        "in flight",
        lambda f: f.last_outcome in _IN_FLIGHT,
        lambda f: f.state(StateCode.BEING_CONFIRMED, *wording("being_confirmed")),
    ),
    Rule(
        "failed",
        lambda f: (
            f.status == P.PAYMENT_FAILED and not f.paid and f.last_outcome == Outcome.FAILED.value
        ),
        _failed,
    ),
    Rule(
        "cancelled",
        lambda f: f.status == P.CANCELLED,
        lambda f: f.state(
            StateCode.CANCELLED,
            "This purchase was cancelled",
            "This purchase was cancelled before any payment was taken.",
            final=True,
        ),
    ),
    Rule(
        "expired",
        lambda f: f.status == P.EXPIRED,
        lambda f: f.state(
            StateCode.EXPIRED,
            "This purchase has expired",
            "The price for this purchase expired before any payment was taken. "
            "Please start a new purchase at the store.",
            final=True,
        ),
    ),
    Rule(
        "awaiting payment",
        lambda f: f.status == P.AWAITING_PAYMENT and f.last_payment is None,
        lambda f: f.state(
            StateCode.AWAITING_PAYMENT,
            "Waiting for payment",
            "No payment has been made for this purchase yet.",
        ),
    ),
    # Anything else (a status and an operation that disagree) goes to a person.
    Rule("anything else", lambda f: True, _under_review),
)


def customer_state(purchase) -> CustomerState:
    """The plain-language state of a purchase, from verified data only: the first rule of
    RULES that holds."""
    facts = _facts(purchase)
    for rule in RULES:
        if rule.when(facts):
            return rule.then(facts)
    raise AssertionError("RULES ends with a rule that always holds")
