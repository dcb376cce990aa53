"""Request parsing and response documentation for the storefront API.

Input serializers only validate shapes (no business rules: those are the services');
output serializers exist to document the dicts built by payments.selectors in the
OpenAPI schema — views render the selector dicts directly.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from rest_framework import serializers

from ..enums import (
    DisputeStatus,
    Grade,
    Origin,
    Outcome,
    Owner,
    PurchaseStatus,
    RetryAdvice,
    Stage,
    Verification,
)

# Verity never collects card data: a payment method is a provider token, never a number.
payment_method_token = RegexValidator(
    r"^(pm|tok|src|card)_[A-Za-z0-9_]{1,96}$",
    "Send a provider payment-method token (for example pm_…), never card details.",
)
currency_code = RegexValidator(r"^[A-Za-z]{3}$", "An ISO 4217 currency code, e.g. usd.")


# -- requests -----------------------------------------------------------------------


class QuoteItemIn(serializers.Serializer):
    sku = serializers.CharField(max_length=64)
    quantity = serializers.IntegerField(min_value=1, max_value=10_000)


class QuoteCreateIn(serializers.Serializer):
    # many=True passes max_length on to the ListSerializer; the stubs allow it on neither.
    items = QuoteItemIn(many=True, allow_empty=False, max_length=50)  # type: ignore[call-arg]
    currency = serializers.CharField(min_length=3, max_length=3, validators=[currency_code])


class CustomerIn(serializers.Serializer):
    reference = serializers.CharField(max_length=200)
    # The column's length (254, RFC 5321's path limit): a longer address would pass the
    # serializer and fail the INSERT with a 500.
    email = serializers.EmailField(required=False, allow_blank=True, default="", max_length=254)


class PurchaseCreateIn(serializers.Serializer):
    quote_id = serializers.CharField(max_length=40)
    quote_version = serializers.IntegerField(min_value=1, max_value=2_147_483_647)
    customer = CustomerIn()
    acknowledge_unresolved = serializers.ListField(
        child=serializers.CharField(max_length=40),
        required=False,
        default=list,
        max_length=20,
        help_text="Earlier purchases of this customer the storefront's own checkout asked "
        "the buyer about: honoured only for a client with storefront confirmation "
        "enabled (never over MCP).",
    )
    buyer_confirmation = serializers.CharField(
        max_length=20,
        required=False,
        allow_blank=True,
        default="",
        help_text="The single-use code the buyer got on the earlier purchase's status page "
        '("yes, start a new purchase"): lifts the unresolved and duplicate guards '
        "for that purchase.",
    )


class PaymentCreateIn(serializers.Serializer):
    payment_method = serializers.CharField(max_length=100, validators=[payment_method_token])
    capture = serializers.ChoiceField(choices=["automatic", "manual"], default="automatic")
    retry_of = serializers.CharField(
        max_length=40,
        required=False,
        allow_null=True,
        default=None,
        help_text="A failed payment operation of this purchase this payment deliberately "
        "retries (once, with a new key and a new payment method after a decline).",
    )
    amount = serializers.IntegerField(
        min_value=1,
        max_value=10**12,
        required=False,
        allow_null=True,
        default=None,
        help_text="Optional; the amount comes from the quote and any other value is refused.",
    )
    currency = serializers.CharField(
        min_length=3,
        max_length=3,
        validators=[currency_code],
        required=False,
        allow_null=True,
        default=None,
        help_text="Optional; the quote's currency. Any other is 422 `currency_mismatch`.",
    )


class RefundCreateIn(serializers.Serializer):
    amount = serializers.IntegerField(
        min_value=1,
        max_value=10**12,
        required=False,
        allow_null=True,
        default=None,
        help_text="Minor units; default: all that is refundable.",
    )
    currency = serializers.CharField(
        min_length=3,
        max_length=3,
        validators=[currency_code],
        required=False,
        allow_null=True,
        default=None,
        help_text="Optional; the purchase's currency. Any other is 422 `currency_mismatch`.",
    )


class ResolveIn(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=[Outcome.SUCCEEDED.value, Outcome.FAILED.value])
    reason = serializers.CharField(max_length=2000, help_text="Required: why (audited).")


class DeclineIn(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, help_text="Required: why (audited).")


class EmptyIn(serializers.Serializer):
    """No fields: the path says everything."""


# -- responses ----------------------------------------------------------------------


class NextActionOut(serializers.Serializer):
    owner = serializers.ChoiceField(choices=Owner.choices)
    retry = serializers.ChoiceField(choices=RetryAdvice.choices)
    code = serializers.CharField()
    message = serializers.CharField()


class ProblemOut(serializers.Serializer):
    """RFC 9457 problem details (application/problem+json)."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.CharField(help_text="Stable machine-readable code.")
    purchase = serializers.CharField(allow_null=True)
    operation = serializers.CharField(allow_null=True)
    next_action = NextActionOut()
    # A declared field: DRF's metaclass takes it out of the class, so Serializer.errors is
    # untouched (the stubs read it as an override).
    errors = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Field errors (invalid_request).",
    )


class ProductOut(serializers.Serializer):
    sku = serializers.CharField()
    name = serializers.CharField()
    price = serializers.IntegerField(help_text="minor units")
    currency = serializers.CharField()
    stock = serializers.IntegerField()
    kind = serializers.CharField()


class ProductListOut(serializers.Serializer):
    products = ProductOut(many=True)


class QuoteItemOut(serializers.Serializer):
    sku = serializers.CharField()
    name = serializers.CharField(allow_null=True)
    quantity = serializers.IntegerField()
    unit_price = serializers.IntegerField(allow_null=True)


class QuoteOut(serializers.Serializer):
    id = serializers.CharField()
    version = serializers.IntegerField()
    items = QuoteItemOut(many=True)
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    expires_at = serializers.DateTimeField()
    next_action = NextActionOut()


class QuoteRefOut(serializers.Serializer):
    id = serializers.CharField()
    version = serializers.IntegerField()


class CustomerOut(serializers.Serializer):
    reference = serializers.CharField()
    email = serializers.CharField(allow_blank=True)


class X402Out(serializers.Serializer):
    """x402: the authorization and its settlement on chain (no signature, only its hash);
    for a refund, its transfer back to the payer (no authorization: valid_before null)."""

    network = serializers.CharField()
    payer = serializers.CharField()
    transaction = serializers.CharField(allow_null=True)
    confirmations = serializers.IntegerField()
    valid_before = serializers.DateTimeField(allow_null=True)
    payment_identifier = serializers.CharField(allow_null=True)


class PaymentSummaryOut(serializers.Serializer):
    operation = serializers.CharField()
    outcome = serializers.ChoiceField(choices=Outcome.choices)
    grade = serializers.CharField(allow_null=True)
    rail = serializers.CharField(required=False, help_text="stripe / x402")
    x402 = X402Out(required=False, allow_null=True)


class FulfillmentOut(serializers.Serializer):
    order = serializers.CharField()
    inventory = serializers.CharField()
    ledger = serializers.CharField()
    confirmation = serializers.CharField()
    crm = serializers.CharField()
    deliverable = serializers.CharField(required=False)


class DisputeOut(serializers.Serializer):
    id = serializers.CharField()
    status = serializers.ChoiceField(choices=DisputeStatus.choices)
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    reason = serializers.CharField(allow_null=True)
    evidence_due_by = serializers.DateTimeField(allow_null=True)


class RefundSummaryOut(serializers.Serializer):
    refunded = serializers.IntegerField(help_text="minor units the provider refunded")
    in_flight = serializers.IntegerField(help_text="minor units of refunds not settled yet")
    awaiting_approval = serializers.IntegerField()
    last_failed_reason = serializers.CharField(
        allow_null=True, help_text="why the latest failed refund failed"
    )


class PurchaseOut(serializers.Serializer):
    id = serializers.CharField()
    status = serializers.ChoiceField(choices=PurchaseStatus.choices)
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    quote = QuoteRefOut()
    customer = CustomerOut()
    payment = PaymentSummaryOut(allow_null=True)
    fulfillment = FulfillmentOut()
    refunds = RefundSummaryOut()
    order_reference = serializers.CharField(allow_null=True)
    disputes = DisputeOut(many=True)
    next_action = NextActionOut()
    customer_message = serializers.CharField()
    status_url = serializers.URLField()
    created_at = serializers.DateTimeField()


class AttemptsOut(serializers.Serializer):
    dispatch = serializers.IntegerField()
    reconcile = serializers.IntegerField()


class HoldOut(serializers.Serializer):
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    state = serializers.CharField()


class OperationOut(serializers.Serializer):
    id = serializers.CharField()
    purchase = serializers.CharField()
    purchase_status = serializers.ChoiceField(choices=PurchaseStatus.choices)
    kind = serializers.CharField()
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    capture = serializers.CharField()
    outcome = serializers.ChoiceField(choices=Outcome.choices)
    stage = serializers.ChoiceField(choices=Stage.choices)
    grade = serializers.ChoiceField(choices=[g for g in Grade.values if g], allow_null=True)
    verification = serializers.ChoiceField(choices=Verification.choices)
    reason = serializers.CharField(allow_null=True)
    attempts = AttemptsOut()
    hold = HoldOut(allow_null=True)
    # A declared field, not Field.parent (DRF's metaclass takes it out of the class).
    parent = serializers.CharField(allow_null=True)  # type: ignore[assignment]
    origin = serializers.ChoiceField(choices=Origin.choices)
    retry_of = serializers.CharField(allow_null=True)
    retried_by = serializers.CharField(allow_null=True)
    next_action = NextActionOut()
    created_at = serializers.DateTimeField()
    settled_at = serializers.DateTimeField(allow_null=True)
    rail = serializers.CharField(required=False, help_text="stripe / x402")
    x402 = X402Out(required=False, allow_null=True)


class LimitsOut(serializers.Serializer):
    currency = serializers.CharField()
    limit = serializers.IntegerField(allow_null=True, help_text="null = no limit")
    period = serializers.CharField()
    period_start = serializers.DateTimeField(allow_null=True)
    consumed = serializers.IntegerField()
    reserved = serializers.IntegerField()
    unknown_exposure = serializers.IntegerField(
        help_text="Reserved amounts of operations whose outcome is unknown."
    )
    available = serializers.IntegerField(allow_null=True)


class DeliverableOut(serializers.Serializer):
    job_reference = serializers.CharField()
    result = serializers.JSONField()
    expires_at = serializers.DateTimeField(allow_null=True)
    operation = serializers.CharField(required=False, help_text="x402: the paying operation")


class DeliverablePendingOut(serializers.Serializer):
    """x402: paid and being prepared, or sent and waiting for the chain (don't pay again)."""

    code = serializers.CharField(
        help_text="deliverable_preparing / settlement_pending / payment_unknown"
    )
    operation = serializers.CharField()
    outcome = serializers.CharField(required=False)
    detail = serializers.CharField()
    next_action = serializers.JSONField(required=False)
