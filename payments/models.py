"""Payments domain. Only payments.services writes Purchase and PaymentOperation."""

import secrets
from typing import TYPE_CHECKING, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now, Upper
from django.utils import timezone
from django_fsm import RETURN_VALUE, FSMField, transition

if TYPE_CHECKING:
    # mypy reads django_fsm's ConcurrentTransitionMixin as Any, which made Purchase and
    # PaymentOperation Any everywhere; the mixin adds no API the code calls.
    class ConcurrentTransitionMixin:
        pass

else:
    from django_fsm import ConcurrentTransitionMixin
from rest_framework_api_key.models import AbstractAPIKey, APIKeyManager

from .enums import (
    PAYMENT_KINDS,
    SLOT_HOLDING_OUTCOMES,
    CallPurpose,
    CallStep,
    Classification,
    DisputeStatus,
    Grade,
    HoldState,
    LimitPeriod,
    OperationKind,
    Origin,
    Outcome,
    Owner,
    PurchaseStatus,
    Rail,
    Stage,
    Verification,
)


def _opaque(prefix: str) -> str:
    # Opaque, never sequential: ids appear in URLs and support tickets.
    return f"{prefix}_{secrets.token_hex(12)}"


def new_purchase_id() -> str:
    return _opaque("pur")


def new_operation_id() -> str:
    return _opaque("op")


def new_quote_id() -> str:
    return _opaque("quo")


def new_status_token() -> str:
    return secrets.token_urlsafe(24)


def new_provider_key() -> str:
    # Server-generated provider idempotency key base; each write sends "<key>:<step>".
    return f"vk_{secrets.token_hex(16)}"


class ApiClientManager(APIKeyManager):
    def get_from_key(self, key: str) -> "ApiClient":
        """The library's lookup, typed: it answers rows of this manager's model."""
        client = super().get_from_key(key)
        assert isinstance(client, ApiClient)
        return client


class ApiClient(AbstractAPIKey):
    """A storefront credential: hashed key (djangorestframework-api-key), scopes, limit."""

    objects: ClassVar[ApiClientManager] = ApiClientManager()

    scopes = models.JSONField(default=list)
    spending_limit = models.BigIntegerField(default=0, help_text="minor units; 0 = no limit")
    currency = models.CharField(max_length=3, default="usd")
    limit_period = models.CharField(
        max_length=8, choices=LimitPeriod.choices, default=LimitPeriod.NONE
    )
    auto_refund_limit = models.BigIntegerField(
        default=0, help_text="API refunds up to this amount skip approval; 0 = always approve"
    )
    # A storefront that is not an agent (its own checkout asked the buyer) may lift the
    # unresolved/duplicate purchase guards by naming the earlier purchase in
    # `acknowledge_unresolved`. Off by default, and never honoured over MCP: an agent's
    # word is not the buyer's (docs/walkthrough.md#api-rules-the-code-relies-on).
    storefront_confirmation = models.BooleanField(default=False)

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API client"

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or [])


class Product(models.Model):
    class Kind(models.TextChoices):
        PHYSICAL = "physical"
        DIGITAL = "digital"

    sku = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    price = models.BigIntegerField(help_text="minor units")
    currency = models.CharField(max_length=3, default="usd")
    stock = models.IntegerField(default=0)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PHYSICAL)
    # Per-product override of recovery.StepPolicy defaults, e.g. {"order": "manual"}.
    step_policy = models.JSONField(default=dict, blank=True)
    # The duplicate-purchase guard: the same buyer and basket within this many seconds of a
    # paid or unresolved purchase is refused (None: settings.DUPLICATE_PURCHASE_WINDOW_SECONDS);
    # `never_twice` (digital goods, licences) refuses it at any time.
    duplicate_window_seconds = models.PositiveIntegerField(null=True, blank=True)
    never_twice = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(price__gte=0), name="product_price_nonneg")
        ]

    def __str__(self) -> str:
        return self.sku


class Quote(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_quote_id, editable=False)
    api_client = models.ForeignKey(ApiClient, null=True, blank=True, on_delete=models.PROTECT)
    items = models.JSONField(help_text="[{sku, name, quantity, unit_price}]")
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    version = models.PositiveIntegerField(default=1)
    expires_at = models.DateTimeField()
    superseded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(amount__gt=0), name="quote_amount_pos")]


class PurchaseChannel(models.TextChoices):
    """The way in a purchase came, set once by the code that opens it (console, customer
    status page and metrics show it). Stored values are never reused for another way in."""

    API = "api", "Shop checkout (REST API)"  # /api/v1/purchases (payments.apis)
    MCP = "mcp", "AI agent (MCP)"  # an agent's create_purchase tool (agents.tools)
    ACP = "acp", "AI agent (Agentic Commerce Protocol)"  # a checkout session (acp/)
    DRILL = "drill", "Operator drill"  # fault drills and demo commands (payments.drills)


class Purchase(ConcurrentTransitionMixin, models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_purchase_id, editable=False)
    quote = models.ForeignKey(Quote, on_delete=models.PROTECT, related_name="purchases")
    api_client = models.ForeignKey(ApiClient, null=True, blank=True, on_delete=models.PROTECT)
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    customer_reference = models.CharField(max_length=200, db_index=True)
    # The matching key of the reference (trimmed, NFKC, case-folded): the guards compare
    # this, scoped to `api_client`, never the raw bytes (payments.customers).
    customer_key = models.CharField(max_length=200, blank=True)
    # sha256 of the basket (sorted sku/quantity lines, amount, currency): the duplicate guard.
    basket_fingerprint = models.CharField(max_length=64, blank=True)
    customer_email = models.EmailField(blank=True, db_index=True)
    status = FSMField(
        max_length=32,
        choices=PurchaseStatus.choices,
        default=PurchaseStatus.AWAITING_PAYMENT,
        protected=True,
    )
    status_token = models.CharField(max_length=64, unique=True, default=new_status_token)
    recovery_owner = models.CharField(max_length=100, blank=True)
    acknowledged_unresolved = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    # When the purchase last entered `paid` (the time of its latest status transition to
    # paid; stored so the console need not derive it with a subquery per row). Written by
    # every status change that saves through `status_change_fields()`.
    paid_at = models.DateTimeField(null=True, blank=True)
    channel = models.CharField(
        max_length=16, choices=PurchaseChannel.choices, default=PurchaseChannel.API
    )

    class Meta:
        constraints = [
            # A quote backs at most one purchase: a second create_purchase on the same quote
            # (whatever the customer fields say) is the same purchase (services.purchase_open).
            models.UniqueConstraint(fields=["quote"], name="purchase_one_per_quote"),
        ]
        indexes = [
            models.Index(
                fields=["api_client", "customer_key", "created_at"],
                name="purchase_client_customer_idx",
            ),
            # The console's paid-without-order queue (support.selectors).
            models.Index(
                fields=["updated_at"],
                name="purchase_awaiting_order_idx",
                condition=Q(
                    status__in=[PurchaseStatus.PAID.value, PurchaseStatus.FULFILLING.value]
                ),
            ),
            # The same queue's count and oldest on the dashboard, read in paid_at order: a
            # nested-loop anti join on the order's purchase_id stops at the count's cap
            # instead of hashing every order (support.counts, bench/scale.py).
            models.Index(
                fields=["paid_at"],
                name="purchase_paid_no_order_idx",
                condition=Q(
                    status__in=[PurchaseStatus.PAID.value, PurchaseStatus.FULFILLING.value]
                ),
            ),
            # Console search by e-mail: customer_email__iexact is UPPER(customer_email).
            models.Index(Upper("customer_email"), name="purchase_email_upper_idx"),
            # GET /api/v1/purchases: a client's purchases newest first, keyset-paginated.
            models.Index(
                F("api_client"),
                F("created_at").desc(),
                F("id").desc(),
                name="purchase_client_list_idx",
            ),
        ]

    # Transitions set fields only (no side effects); services lock, transition, save.
    S = PurchaseStatus

    @transition(
        field=status,
        source=[
            S.AWAITING_PAYMENT,
            S.PAYMENT_FAILED,
            S.PAYMENT_UNKNOWN,
            S.ACTION_REQUIRED,
            S.MANUAL_REVIEW,
        ],
        target=S.PAYMENT_PENDING,
    )
    def mark_payment_pending(self): ...

    @transition(
        field=status,
        source=[S.PAYMENT_PENDING, S.AWAITING_PAYMENT, S.MANUAL_REVIEW],
        target=S.PAYMENT_UNKNOWN,
    )
    def mark_payment_unknown(self): ...

    @transition(
        field=status,
        source=[S.PAYMENT_PENDING, S.PAYMENT_UNKNOWN, S.AWAITING_PAYMENT, S.MANUAL_REVIEW],
        target=S.ACTION_REQUIRED,
    )
    def mark_action_required(self): ...

    def status_change_fields(self) -> list[str]:
        """The fields to save after a status transition was applied in memory: when it
        entered `paid`, `paid_at` is set to now as well (the history row written with it
        carries the same moment)."""
        if self.status == PurchaseStatus.PAID:
            self.paid_at = timezone.now()
            return ["status", "paid_at", "updated_at"]
        return ["status", "updated_at"]

    @transition(
        field=status,
        source=[
            S.PAYMENT_PENDING,
            S.PAYMENT_UNKNOWN,
            S.ACTION_REQUIRED,
            S.AWAITING_PAYMENT,
            S.MANUAL_REVIEW,
        ],
        target=S.PAYMENT_FAILED,
    )
    def mark_payment_failed(self): ...

    @transition(
        field=status,
        source=[
            S.PAYMENT_PENDING,
            S.PAYMENT_UNKNOWN,
            S.ACTION_REQUIRED,
            S.AWAITING_PAYMENT,
            S.PAYMENT_FAILED,
            S.MANUAL_REVIEW,
        ],
        target=S.PAID,
    )
    def mark_paid(self): ...

    @transition(field=status, source=[S.PAID, S.MANUAL_REVIEW], target=S.FULFILLING)
    def mark_fulfilling(self): ...

    @transition(field=status, source=[S.PAID, S.FULFILLING, S.MANUAL_REVIEW], target=S.COMPLETED)
    def mark_completed(self): ...

    @transition(field=status, source="*", target=S.MANUAL_REVIEW)
    def mark_manual_review(self): ...

    @transition(
        field=status,
        source=[S.PAID, S.FULFILLING, S.COMPLETED, S.MANUAL_REVIEW, S.REFUND_PENDING],
        target=S.REFUND_PENDING,
    )
    def mark_refund_pending(self): ...

    # DISPUTE_WON too: the merchant kept the money, then gave it back in full (goodwill).
    @transition(
        field=status,
        source=[
            S.PAID,
            S.FULFILLING,
            S.COMPLETED,
            S.MANUAL_REVIEW,
            S.REFUND_PENDING,
            S.DISPUTED,
            S.DISPUTE_WON,
        ],
        target=S.REFUNDED,
    )
    def mark_refunded(self): ...

    # Disputes (payments.services.disputes): open from any paid state, close by how it ended; an
    # inquiry closed without a dispute (`warning_closed`) returns to the state before it.
    @transition(
        field=status,
        source=[
            S.PAID,
            S.FULFILLING,
            S.COMPLETED,
            S.MANUAL_REVIEW,
            S.REFUND_PENDING,
            S.REFUNDED,
            S.DISPUTE_WON,
            S.DISPUTE_LOST,
        ],
        target=S.DISPUTED,
    )
    def mark_disputed(self): ...

    @transition(field=status, source=S.DISPUTED, target=S.DISPUTE_WON)
    def mark_dispute_won(self): ...

    @transition(field=status, source=S.DISPUTED, target=S.DISPUTE_LOST)
    def mark_dispute_lost(self): ...

    @transition(
        field=status,
        source=S.DISPUTED,
        target=RETURN_VALUE(
            S.PAID, S.FULFILLING, S.COMPLETED, S.MANUAL_REVIEW, S.REFUND_PENDING, S.REFUNDED
        ),
    )
    def mark_dispute_withdrawn(self, restore_to: str) -> str:
        return restore_to

    # A refund that left `refund_pending` without refunding everything (partial success,
    # failure) returns the purchase to where it was before
    # (docs/reliability.md#rules-every-money-movement-obeys).
    @transition(
        field=status,
        source=S.REFUND_PENDING,
        target=RETURN_VALUE(S.PAID, S.FULFILLING, S.COMPLETED, S.MANUAL_REVIEW),
    )
    def restore_after_refund(self, prior):
        return prior

    # COMPLETED too: an operator may void after fulfilment (console, with a reason); the
    # compensating steps then cancel the order (docs/recovery.md#cancelled-and-expired).
    @transition(
        field=status,
        source=[S.PAID, S.FULFILLING, S.COMPLETED, S.MANUAL_REVIEW, S.REFUND_PENDING],
        target=S.VOIDED,
    )
    def mark_voided(self): ...

    @transition(
        field=status, source=[S.AWAITING_PAYMENT, S.PAYMENT_FAILED, S.VOIDED], target=S.CANCELLED
    )
    def mark_cancelled(self): ...

    @transition(field=status, source=[S.AWAITING_PAYMENT, S.PAYMENT_FAILED], target=S.EXPIRED)
    def mark_expired(self): ...

    del S


class BuyerConfirmation(models.Model):
    """The buyer's own "yes, start a new purchase", given on the earlier purchase's status
    page. Single use, short-lived, stored only as a hash: the buyer reads the code off the
    page and gives it to the storefront; an agent cannot make one up."""

    purchase = models.ForeignKey(
        Purchase, on_delete=models.PROTECT, related_name="buyer_confirmations"
    )
    code_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_for = models.CharField(max_length=40, blank=True, help_text="the new purchase's id")


class PaymentOperation(ConcurrentTransitionMixin, models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_operation_id, editable=False)
    purchase = models.ForeignKey(Purchase, on_delete=models.PROTECT, related_name="operations")
    kind = models.CharField(max_length=16, choices=OperationKind.choices)
    rail = models.CharField(max_length=8, choices=Rail.choices, default=Rail.STRIPE)
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    # Created once, persisted before the first provider request; never the client's key.
    idempotency_key = models.CharField(max_length=64, unique=True, default=new_provider_key)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    provider_reference = models.CharField(max_length=100, blank=True, db_index=True)
    provider_charge = models.CharField(max_length=100, blank=True, db_index=True)
    provider_account = models.CharField(max_length=100, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    retry_of = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="retried_by"
    )
    payment_method = models.CharField(max_length=100, blank=True, help_text="a provider token")
    capture_method = models.CharField(max_length=16, default="automatic")
    outcome = FSMField(
        max_length=24, choices=Outcome.choices, default=Outcome.PENDING, protected=True
    )
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.QUEUED)
    grade = models.CharField(max_length=16, choices=Grade.choices, default=Grade.NONE, blank=True)
    verification = models.CharField(
        max_length=16, choices=Verification.choices, default=Verification.UNVERIFIED
    )
    reason = models.CharField(max_length=40, blank=True)
    next_action_owner = models.CharField(max_length=16, choices=Owner.choices, default=Owner.NONE)
    provider_status = models.CharField(max_length=40, blank=True)
    requested_by_client = models.ForeignKey(
        ApiClient, null=True, blank=True, on_delete=models.PROTECT
    )
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    confirm_claimed_at = models.DateTimeField(null=True, blank=True)
    dispatch_deadline = models.DateTimeField(null=True, blank=True, db_index=True)
    reconcile_attempts = models.PositiveIntegerField(default=0)
    next_reconcile_at = models.DateTimeField(null=True, blank=True, db_index=True)
    reconcile_deadline = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    is_compensation = models.BooleanField(default=False)
    # `provider`: a refund/capture/cancel the provider reported that no Verity operation
    # requested (an external linked operation, created already settled by the evidence).
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.VERITY)
    # External operations wait in a queue until a person reviews them. ("Acknowledged" is
    # only a grade: an outcome settled on a person's word, not the provider's.)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.CharField(max_length=150, blank=True)
    # A second confirmed charge/authorization on a purchase (the one confirmed later): it
    # does not pay the purchase; a linked compensating refund/void returns it.
    is_duplicate = models.BooleanField(default=False)
    # The database's clock, not the writing host's: it bounds below the read of the
    # provider's objects by metadata (docs/reliability.md, "The read's bounds").
    created_at = models.DateTimeField(db_default=Now(), db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="op_amount_pos"),
            # One money movement at a time per purchase, enforced by PostgreSQL.
            models.UniqueConstraint(
                fields=["purchase"],
                condition=Q(outcome__in=[o.value for o in SLOT_HOLDING_OUTCOMES]),
                name="op_one_active_per_purchase",
            ),
            # One charge per purchase: at most one successful charge/authorization per purchase.
            # A provider-confirmed duplicate (is_duplicate) is recorded as what the
            # provider did, and compensated; it never counts as the purchase's payment.
            models.UniqueConstraint(
                fields=["purchase"],
                condition=Q(
                    outcome=Outcome.SUCCEEDED.value,
                    kind__in=[k.value for k in PAYMENT_KINDS],
                    is_duplicate=False,
                ),
                name="op_one_success_payment_per_purchase",
            ),
            # One external operation per provider object (a refund reported by both
            # `refund.created` and `charge.refunded` is recorded once).
            models.UniqueConstraint(
                fields=["kind", "provider_reference"],
                condition=Q(origin=Origin.PROVIDER.value),
                name="op_external_once_per_provider_object",
            ),
        ]
        # The console's queues and dashboard counts (support.selectors), measured by
        # bench/scale.py (docs/performance.md): each is partial, so it stays as small as the
        # queue while settled operations (most of the table) stay out of it.
        indexes = [
            # Open operations by outcome, oldest first: unknown, escalated, refund approval.
            # `id` included: money at risk takes the unknown ids from the index alone.
            models.Index(
                fields=["outcome", "created_at"],
                name="op_open_by_outcome_idx",
                include=["id"],
                condition=~Q(outcome__in=[Outcome.SUCCEEDED.value, Outcome.FAILED.value]),
            ),
            models.Index(
                fields=["created_at"], name="op_compensation_idx", condition=Q(is_compensation=True)
            ),
            # The dashboard's "recently settled payments" figure.
            models.Index(
                fields=["settled_at"],
                name="op_succeeded_settled_idx",
                condition=Q(outcome=Outcome.SUCCEEDED.value),
            ),
            # The duplicate-charges queue, oldest by settled_at.
            models.Index(
                fields=["settled_at"],
                name="op_duplicate_settled_idx",
                condition=Q(is_duplicate=True),
            ),
            # The escalated queue (support.queues), oldest first: only escalated
            # operations, not every open one read back to find none escalated.
            models.Index(
                fields=["created_at"],
                name="op_escalated_idx",
                condition=Q(stage=Stage.ESCALATED.value) | Q(escalated_at__isnull=False),
            ),
            # The overturned-resolution queue (support.queues): operations waiting for
            # support, oldest by settled_at, each probed for an overturn transition.
            models.Index(
                fields=["settled_at"],
                name="op_support_owned_settled_idx",
                condition=Q(next_action_owner=Owner.SUPPORT.value),
            ),
        ]

    Oc = Outcome
    _SETTLEABLE = [Oc.DISPATCHING, Oc.UNKNOWN, Oc.AWAITING_PROVIDER, Oc.AWAITING_BUYER]

    @transition(field=outcome, source=Oc.AWAITING_APPROVAL, target=Oc.PENDING)
    def approve(self):
        self.stage = Stage.QUEUED

    @transition(field=outcome, source=[Oc.PENDING, Oc.DISPATCHING], target=Oc.DISPATCHING)
    def start_dispatch(self):
        self.stage = Stage.DISPATCHING

    @transition(field=outcome, source=_SETTLEABLE + [Oc.PENDING], target=Oc.SUCCEEDED)
    def settle_succeeded(self):
        self.stage = Stage.SETTLED

    @transition(
        field=outcome, source=_SETTLEABLE + [Oc.PENDING, Oc.AWAITING_APPROVAL], target=Oc.FAILED
    )
    def settle_failed(self):
        self.stage = Stage.SETTLED

    # Verified provider evidence overturns a person's (acknowledged) terminal outcome.
    @transition(field=outcome, source=[Oc.FAILED], target=Oc.SUCCEEDED)
    def overturn_to_succeeded(self):
        self.stage = Stage.SETTLED

    @transition(field=outcome, source=[Oc.SUCCEEDED], target=Oc.FAILED)
    def overturn_to_failed(self):
        self.stage = Stage.SETTLED

    @transition(
        field=outcome,
        source=[Oc.PENDING, Oc.DISPATCHING, Oc.AWAITING_PROVIDER, Oc.AWAITING_BUYER],
        target=Oc.UNKNOWN,
    )
    def mark_unknown(self):
        self.stage = Stage.RECONCILING

    @transition(
        field=outcome,
        source=[Oc.DISPATCHING, Oc.UNKNOWN, Oc.AWAITING_BUYER, Oc.AWAITING_PROVIDER],
        target=Oc.AWAITING_PROVIDER,
    )
    def mark_awaiting_provider(self):
        self.stage = Stage.RECONCILING

    @transition(
        field=outcome,
        source=[Oc.DISPATCHING, Oc.UNKNOWN, Oc.AWAITING_PROVIDER, Oc.AWAITING_BUYER],
        target=Oc.AWAITING_BUYER,
    )
    def mark_awaiting_buyer(self):
        self.stage = Stage.RECONCILING

    del Oc

    @property
    def is_terminal(self) -> bool:
        return self.outcome in (Outcome.SUCCEEDED, Outcome.FAILED)

    def provider_key(self, step: str) -> str:
        return f"{self.idempotency_key}:{step}"


class X402Authorization(models.Model):
    """The EIP-3009 authorization behind an x402 charge, persisted before settle is called.

    (payer, nonce) is the authorization's identity on chain and the operation's idempotency
    key; `payment_identifier` is the x402 extension's id when the agent sent one. Only a
    hash of the signature is kept: the signature itself lets anyone move the money.
    """

    operation = models.OneToOneField(
        PaymentOperation, on_delete=models.PROTECT, related_name="x402", primary_key=True
    )
    network = models.CharField(max_length=40)
    asset = models.CharField(max_length=42)
    pay_to = models.CharField(max_length=42)
    payer = models.CharField(max_length=42, help_text="checksummed `from`")
    nonce = models.CharField(max_length=66, help_text="0x + 32 bytes")
    value = models.CharField(max_length=78, help_text="atomic units of the asset")
    valid_after = models.BigIntegerField()
    valid_before = models.BigIntegerField()
    signature_hash = models.CharField(max_length=64)
    payload_hash = models.CharField(max_length=64)
    payment_identifier = models.CharField(max_length=128, blank=True)
    # Whose `payment_identifier` it is: the buyer's idempotency key names a payment among
    # its own API client's only (x402_one_op_per_client_payment_identifier).
    api_client = models.ForeignKey(
        ApiClient, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The settlement's transaction (broadcast or mined) and what the chain said last.
    transaction_hash = models.CharField(max_length=66, blank=True, db_index=True)
    block_number = models.BigIntegerField(null=True, blank=True)
    confirmations = models.PositiveIntegerField(default=0)
    settle_answer = models.JSONField(
        default=dict, blank=True, help_text="the facilitator's SettleResponse, safe fields"
    )
    # The proof of payment this operation claims: THIS authorization's Transfer(payer ->
    # pay_to, value) log on chain, by transaction and block log index
    # (payments.providers.x402.authorization_transfer). One log pays one operation: the
    # database refuses a second claim (x402_one_op_per_proving_log).
    proof_transaction = models.CharField(max_length=66, blank=True, default="")
    proof_log_index = models.PositiveIntegerField(null=True, blank=True)
    # When the proving log's block became final (the RPC's `finalized` tag, or the
    # network's depth): until then a succeeded payment is read again (x402_finality).
    final_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["payer", "nonce"], name="x402_one_op_per_authorization"
            ),
            models.UniqueConstraint(
                fields=["network", "asset", "proof_transaction", "proof_log_index"],
                condition=~Q(proof_transaction=""),
                name="x402_one_op_per_proving_log",
            ),
            models.UniqueConstraint(
                fields=["api_client", "payment_identifier"],
                condition=~Q(payment_identifier=""),
                name="x402_one_op_per_client_payment_identifier",
            ),
        ]


class X402RefundTransfer(models.Model):
    """The claim row of an x402 refund: the one token transfer back to the payer.

    Created in the same transaction that claims the refund's send (one row per refund:
    never two transfers back). The signed transaction's hash and the signer's nonce are
    stored *before* it is broadcast, so a lost answer is reconciled read-only from its
    receipt. The refund signer's key is never stored (X402_REFUND_PRIVATE_KEY).
    """

    operation = models.OneToOneField(
        PaymentOperation, on_delete=models.PROTECT, related_name="x402_refund", primary_key=True
    )
    network = models.CharField(max_length=40)
    asset = models.CharField(max_length=42)
    from_address = models.CharField(max_length=42, help_text="the refund signer")
    to_address = models.CharField(max_length=42, help_text="the payer of the charge")
    value = models.CharField(max_length=78, help_text="atomic units of the asset")
    chain_nonce = models.BigIntegerField(null=True, blank=True)
    transaction_hash = models.CharField(max_length=66, blank=True, db_index=True)
    block_number = models.BigIntegerField(null=True, blank=True)
    confirmations = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)


class ProviderCall(models.Model):
    """Every request to the provider. Safe fields only: no card data, no secrets."""

    operation = models.ForeignKey(
        PaymentOperation, on_delete=models.PROTECT, related_name="provider_calls"
    )
    purpose = models.CharField(max_length=16, choices=CallPurpose.choices)
    step = models.CharField(max_length=16, choices=CallStep.choices)
    attempt = models.PositiveSmallIntegerField(default=1)
    key = models.CharField(max_length=100, blank=True)
    request_id = models.CharField(max_length=100, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    classification = models.CharField(max_length=16, choices=Classification.choices, blank=True)
    safe_fields = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    fault_drill = models.CharField(max_length=40, blank=True)
    # Both from the database's clock, whichever host sends: a send's stamps bound above
    # the read of the provider's objects by metadata (docs/reliability.md).
    started_at = models.DateTimeField(db_default=Now(), db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One claim per step: one claim per (operation, write step, attempt); the claim row of
            # attempt 1 is written in the same transaction as the dispatching transition.
            models.UniqueConstraint(
                fields=["operation", "step", "attempt"],
                condition=Q(purpose=CallPurpose.DISPATCH.value),
                name="providercall_one_dispatch_per_step_attempt",
            ),
        ]
        ordering = ["started_at", "id"]


class Hold(models.Model):
    """A spending reservation of one operation against an API client's limit."""

    api_client = models.ForeignKey(ApiClient, on_delete=models.PROTECT, related_name="holds")
    operation = models.OneToOneField(
        PaymentOperation, on_delete=models.PROTECT, related_name="hold"
    )
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    state = models.CharField(max_length=16, choices=HoldState.choices, default=HoldState.RESERVED)
    # The period the reservation counts in, fixed at reservation time.
    period_start = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            # The dashboard's money at risk (reserved holds, unknown exposure).
            # Covering: the sum reads the index only (no heap page per hold).
            models.Index(
                fields=["operation"],
                name="hold_reserved_idx",
                include=["currency", "amount", "api_client"],
                condition=Q(state=HoldState.RESERVED.value),
            ),
        ]


class OperationTransition(models.Model):
    """Append-only history of every operation or purchase transition (the timeline)."""

    purchase = models.ForeignKey(Purchase, on_delete=models.PROTECT, related_name="transitions")
    operation = models.ForeignKey(
        PaymentOperation,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="transitions",
    )
    field = models.CharField(max_length=16)  # "outcome" | "status"
    source = models.CharField(max_length=32)
    target = models.CharField(max_length=32)
    cause = models.CharField(max_length=64)
    evidence = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]


class IdempotencyRecord(models.Model):
    """The storefront's Idempotency-Key, scoped to (API client, route)."""

    class State(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"

    api_client = models.ForeignKey(ApiClient, on_delete=models.CASCADE)
    route = models.CharField(max_length=120)
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IN_FLIGHT)
    lease_until = models.DateTimeField()
    resource_type = models.CharField(max_length=32, blank=True)
    resource_id = models.CharField(max_length=64, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    # The answer itself, for a face whose protocol replays it (ACP: {"status", "body",
    # "headers"}); null where a replay answers the current state (REST, MCP).
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["api_client", "route", "key"], name="idem_scope_unique"
            ),
        ]


class Dispute(models.Model):
    """A provider dispute (chargeback or inquiry) on one of Verity's payments.

    Written only by payments.services.disputes, from verified evidence (a matched webhook or a
    read-back); the status only moves forward (DISPUTE_STATUS_RANK).
    """

    id = models.CharField(primary_key=True, max_length=100, help_text="the provider's id")
    purchase = models.ForeignKey(Purchase, on_delete=models.PROTECT, related_name="disputes")
    payment = models.ForeignKey(PaymentOperation, on_delete=models.PROTECT, related_name="disputes")
    charge = models.CharField(max_length=100, blank=True)
    payment_intent = models.CharField(max_length=100, blank=True)
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    reason = models.CharField(max_length=40, blank=True)
    status = models.CharField(max_length=32, choices=DisputeStatus.choices)
    evidence_due_by = models.DateTimeField(null=True, blank=True, db_index=True)
    funds_withdrawn = models.BigIntegerField(default=0, help_text="minor units, positive")
    funds_reinstated = models.BigIntegerField(default=0, help_text="minor units, positive")
    fees = models.BigIntegerField(default=0, help_text="dispute fees net, minor units")
    # The provider's balance transactions of this dispute, safe fields only:
    # [{id, amount, fee, net, currency, reporting_category}] -- the ledger books each once.
    balance_transactions = models.JSONField(default=list, blank=True)
    verification = models.CharField(max_length=16, default="webhook")
    # The purchase status before the dispute opened (restored if an inquiry is withdrawn).
    purchase_status_before = models.CharField(max_length=32, blank=True)
    opened_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["opened_at", "id"]
