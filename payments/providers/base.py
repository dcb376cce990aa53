"""Provider-neutral types. Only payments/providers/stripe/ imports the Stripe SDK."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypedDict, cast, runtime_checkable

from payments.enums import Classification, Outcome


@dataclass(frozen=True)
class ProviderObject:
    """The safe fields of a provider object (PaymentIntent or Refund). Never card data."""

    object_type: str  # "payment_intent" | "refund"
    id: str
    status: str
    amount: int
    currency: str
    metadata: dict[str, Any] = field(default_factory=dict)
    account: str = ""
    latest_charge: str = ""
    payment_intent: str = ""  # for refunds
    failure_code: str = ""  # last_payment_error.code / refund failure_reason
    has_payment_error: bool = False
    capture_method: str = ""

    # -- the provider's vocabulary ------------------------------------------------------
    # What the provider's record says, in Verity's words: services ask these and never
    # compare a provider's status strings. Each rail's own object (StripeObject,
    # X402Transfer) answers them; a bare ProviderObject belongs to no rail and shows none.

    @property
    def confirm_unapplied(self) -> bool:
        """A payment whose confirm the provider never applied (it still waits for one)."""
        return False

    @property
    def cancellable(self) -> bool:
        """A payment that a cancel at the provider can still stop before money moves
        (the buyer or a slow confirm could otherwise complete it later)."""
        return False

    @property
    def canceled(self) -> bool:
        """The provider cancelled it: no money moved, and none can move any more."""
        return False

    @property
    def money_in_flight(self) -> bool:
        """The provider is still moving the money: it may yet succeed."""
        return False

    @property
    def refund_returned_nothing(self) -> bool:
        """A refund (or transfer back) that ended without returning any money."""
        return False

    @property
    def refund_in_flight(self) -> bool:
        """A refund the provider is still processing: it may yet pay the buyer back."""
        return False

    @property
    def succeeded(self) -> bool:
        """The provider's record states the money movement succeeded (an authorization:
        captured)."""
        return False

    @property
    def final(self) -> bool:
        """A status the provider will not move on its own any more (a webhook stating it
        is as good as a read-back)."""
        return False

    def outcome_for(self, kind: str) -> Outcome | None:
        """The outcome this record states for an operation of `kind`, or None (no
        verdict: absence of evidence is not failure)."""
        return None

    def shows_no_money_moved(self, kind: str) -> bool:
        """This record shows that the money movement of an operation of `kind` did not
        happen (and is no verdict yet: canceled and failed are `outcome_for`'s)."""
        return False

    def safe_fields(self) -> dict[str, Any]:
        return {
            "object": self.object_type,
            "id": self.id,
            "status": self.status,
            "amount": self.amount,
            "currency": self.currency,
            "latest_charge": self.latest_charge,
            "payment_intent": self.payment_intent,
            "failure_code": self.failure_code,
            "metadata": {
                k: v
                for k, v in self.metadata.items()
                if k in ("operation_id", "purchase_id", "customer_reference")
            },
        }


@dataclass(frozen=True)
class BalanceMove:
    """One provider balance transaction of a dispute (withdrawal or reinstatement)."""

    id: str
    amount: int  # signed: negative when the provider withdrew funds
    fee: int  # signed: the dispute fee (positive = charged to us)
    net: int
    currency: str
    reporting_category: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "amount": self.amount,
            "fee": self.fee,
            "net": self.net,
            "currency": self.currency,
            "reporting_category": self.reporting_category,
        }


@dataclass(frozen=True)
class DisputeObject:
    """The safe fields of a provider Dispute. Never the evidence itself (names, e-mails,
    receipts): only ids, status, money, the reason code and the evidence deadline."""

    id: str
    status: str
    amount: int
    currency: str
    reason: str = ""
    charge: str = ""
    payment_intent: str = ""
    evidence_due_by: int | None = None  # epoch seconds
    balance_transactions: tuple[BalanceMove, ...] = ()
    account: str = ""
    is_charge_refundable: bool = False

    def safe_fields(self) -> dict[str, Any]:
        return {
            "object": "dispute",
            "id": self.id,
            "status": self.status,
            "amount": self.amount,
            "currency": self.currency,
            "reason": self.reason,
            "charge": self.charge,
            "payment_intent": self.payment_intent,
            "evidence_due_by": self.evidence_due_by,
            "balance_transactions": [b.as_dict() for b in self.balance_transactions],
        }


def outcome_from_object(obj: ProviderObject, *, kind: str) -> Outcome | None:
    """The outcome the provider's own record states, or None (no verdict).
    Each rail's object reads its own statuses (ProviderObject.outcome_for)."""
    return obj.outcome_for(kind)


def shows_no_money_moved(obj: ProviderObject, *, kind: str) -> bool:
    """The provider's own record of an operation of `kind` shows that its money movement
    did not happen (one rule for every kind). A person's "succeeded" is
    refused against it, and a later read-back that shows it overturns that word. Statuses
    that are verdicts already (canceled, failed) are `outcome_from_object`'s."""
    return obj.shows_no_money_moved(kind)


@dataclass(frozen=True)
class CallResult:
    """How one provider request ended, with whatever safe fields came back."""

    classification: Classification
    http_status: int | None = None
    request_id: str = ""
    error_code: str = ""
    object: ProviderObject | None = None
    fault_drill: str = ""
    detail: str = ""
    # The provider answered from its record of the idempotency key (Stripe's
    # `Idempotent-Replayed: true`): what the object WAS when the key first ran, not now.
    replayed: bool = False


class RailRefusal(NamedTuple):
    """Why a rail cannot do something here, as a stable code and a person's sentence."""

    code: str
    message: str


class PaymentRequest(TypedDict):
    """A payment's provider parameters (payments.services.payment_request): the keyword
    arguments of a PaymentIntent create."""

    amount: int
    currency: str
    payment_method: str
    capture_method: str
    metadata: dict[str, Any]


class RailAdapter(Protocol):
    """What every rail's adapter tells the services about itself (the rail is a seam,
    so the services ask these instead of testing `op.rail`). Registered per rail in
    payments/providers/registry.py."""

    rail: str
    # The provider's id of the object is the operation's identity; False where it may only
    # become known later (x402: the authorization is the identity, its hash comes later).
    reference_is_identity: bool
    # An authorization can be captured or voided later; False where a payment is final
    # when it lands (a transfer on chain). `no_capture_or_void_why` says why to a person.
    has_capture_and_void: bool
    no_capture_or_void_why: str
    # A payment names a provider payment-method token (pm_…/tok_…), checked before it is
    # stored, so card details are never held.
    takes_payment_method_token: bool
    # A refund is Verity's own money sent back: a person approves it, no automatic allowance.
    refunds_need_a_person: bool

    def object_type_for(self, kind: str) -> str:
        """The provider object that records an operation of `kind` on this rail."""
        ...

    def dedupes_idempotency_keys(self) -> bool:
        """The provider returns the first answer for a repeated key (a replay is a read)."""
        ...

    def refund_refusal(self) -> RailRefusal | None:
        """Why no refund can be sent on this rail here (not configured), or None."""
        ...


@runtime_checkable
class PaymentProvider(RailAdapter, Protocol):
    """A rail whose writes and reads are provider API calls (PaymentIntent-shaped): the
    services dispatch and read back through these."""

    def create_payment_intent(
        self,
        *,
        key: str,
        amount: int,
        currency: str,
        payment_method: str,
        capture_method: str,
        metadata: dict[str, Any],
    ) -> CallResult: ...

    def confirm_payment_intent(self, *, key: str, intent_id: str) -> CallResult: ...

    def pays_in_one_call(self) -> bool:
        """A payment is one request (create with confirm) under one key: only where the
        provider dedupes keys, so a lost answer can be asked again under that key."""
        ...

    def create_and_confirm_payment_intent(
        self,
        *,
        key: str,
        amount: int,
        currency: str,
        payment_method: str,
        capture_method: str,
        metadata: dict[str, Any],
    ) -> CallResult: ...

    def capture_payment_intent(
        self, *, key: str, intent_id: str, amount: int | None = None
    ) -> CallResult: ...

    def cancel_payment_intent(self, *, key: str, intent_id: str) -> CallResult: ...

    def create_refund(
        self, *, key: str, intent_id: str, amount: int, metadata: dict[str, Any]
    ) -> CallResult: ...

    def retrieve_payment_intent(self, intent_id: str) -> CallResult: ...

    def retrieve_refund(self, refund_id: str) -> CallResult: ...

    def find_by_metadata(
        self,
        *,
        object_type: str,
        operation_id: str,
        created_since: datetime,
        created_until: datetime | None = None,
        now: Callable[[], datetime],
    ) -> CallResult: ...

    def list_balance_transactions(self, *, limit: int = 100) -> list[dict[str, Any]]: ...

    def retrieve_dispute(self, dispute_id: str) -> tuple[CallResult, DisputeObject | None]: ...

    def list_refunds_for_intent(
        self, intent_id: str
    ) -> tuple[CallResult, list[ProviderObject]]: ...
    def balance_transaction_source(self, txn_id: str) -> str | None: ...


def payment_provider(adapter: RailAdapter) -> PaymentProvider:
    """`adapter` as a rail whose money moves are provider API calls (PaymentIntent-shaped).

    Only such a rail reaches the code that calls these; one that keeps its own evidence
    (payments.services.rail_evidence_for) never does. Raises TypeError for any other."""
    kind = type(adapter)
    makes_calls = _MAKES_CALLS.get(kind)
    if makes_calls is None:  # the protocol check reads every member: once per class
        makes_calls = _MAKES_CALLS[kind] = isinstance(adapter, PaymentProvider)
    if not makes_calls:
        raise TypeError(f"the {adapter.rail} adapter makes no provider API calls")
    return cast(PaymentProvider, adapter)


_MAKES_CALLS: dict[type, bool] = {}
