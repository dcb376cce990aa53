"""Payments services: the only code that writes Purchase and PaymentOperation.

Every function is keyword-only. Errors a caller must show to a client are raised as
`DomainError(code, message, status, retry, owner, purchase=, operation=)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .enums import Owner, RetryAdvice


@dataclass
class DomainError(Exception):
    """A refusal with a stable code. Raised before any effect unless stated."""

    code: str
    message: str
    status: int = 409
    retry: str = RetryAdvice.FORBIDDEN
    owner: str = Owner.BUYER
    purchase: str | None = None
    operation: str | None = None
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# --------------------------------------------------------------------------------------
import hashlib  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import secrets  # noqa: E402
from datetime import timedelta  # noqa: E402
from enum import Enum  # noqa: E402

from django.conf import settings  # noqa: E402
from django.core.exceptions import ValidationError  # noqa: E402
from django.core.validators import validate_email  # noqa: E402
from django.db import IntegrityError, transaction  # noqa: E402
from django.db.models import Q, Sum  # noqa: E402
from django.utils import timezone  # noqa: E402

from recovery.models import OutboxCategory  # noqa: E402
from recovery.outbox import outbox_put  # noqa: E402

from .enums import (  # noqa: E402
    NON_RETRYABLE_REASONS,
    OVERTURN_CAUSE,
    PAYMENT_KINDS,
    SLOT_HOLDING_OUTCOMES,
    UNRESOLVED_STATUSES,
    CallPurpose,
    CallStep,
    Classification,
    Grade,
    HoldState,
    LimitPeriod,
    OperationKind,
    Outcome,
    PurchaseStatus,
    Rail,
    Reason,
    Stage,
    Verification,
)
from .customers import (  # noqa: E402
    PAYMENT_METHOD_TOKEN,
    basket_fingerprint,
    customer_key,
    customer_reference_clean,
)
from .locks import (  # noqa: E402
    assert_no_transaction_outside_transaction,
    lock_client,
    lock_customer,
    lock_operation,
    lock_purchase,
    lock_purchase_and_operation,
)
from .models import (  # noqa: E402
    ApiClient,
    BuyerConfirmation,
    Hold,
    OperationTransition,
    PaymentOperation,
    Product,
    ProviderCall,
    Purchase,
    Quote,
)
from .providers.base import CallResult, ProviderObject, outcome_from_object  # noqa: E402
from .x402_reads import X402_OBJECT_TYPE, x402_read_back  # noqa: E402

log = logging.getLogger("verity.payments")

QUOTE_TTL = timedelta(minutes=30)
NOT_SENT_RESENDS = 2  # DESIGN §10.4: resend a not_sent step at most twice
RETRYABLE_RESENDS = 2
# A 429 / Stripe-Should-Retry answer is resent with the same key after a bounded,
# jittered backoff (base * 2^(n-1), capped), never in a tight loop.
RETRYABLE_BACKOFF_BASE_SECONDS = 0.5
RETRYABLE_BACKOFF_CAP_SECONDS = 2.0


class ApplyResult(str, Enum):
    APPLIED = "applied"
    NO_CHANGE = "no_change"
    STALE = "stale"
    CONFLICT = "conflict"
    MISMATCH = "mismatch"


def _halted(name: str) -> bool:
    try:
        from recovery.selectors import is_halted
    except ImportError:  # recovery selectors not installed yet
        from recovery.models import WorkflowHalt

        return WorkflowHalt.objects.filter(name=name).exists()
    return is_halted(name)


# The workflow whose halt binds each kind of dispatch (DESIGN §5.9): money in, or money
# back out (voids, refunds and compensations obey `refunds`).
_WORKFLOW_OF_KIND = {OperationKind.CHARGE: "checkout", OperationKind.AUTHORIZE: "checkout",
                     OperationKind.CAPTURE: "checkout", OperationKind.VOID: "refunds",
                     OperationKind.REFUND: "refunds"}


def operation_workflow(kind: str) -> str:
    return _WORKFLOW_OF_KIND[OperationKind(kind)]


class _HaltedAtClaim(Exception):
    """The operation's workflow is halted: the claim wrote nothing, it stays queued."""


def _fingerprint(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


# -- history -----------------------------------------------------------------------------
def _history(*, purchase_id: str, operation: PaymentOperation | None, field: str, source: str,
             target: str, cause: str, evidence: dict | None = None, actor: str = "") -> None:
    OperationTransition.objects.create(
        purchase_id=purchase_id, operation=operation, field=field, source=source,
        target=target, cause=cause, evidence=evidence or {}, actor=actor)


def _purchase_to(purchase: Purchase, name: str, *, cause: str, actor: str = "",
                 evidence: dict | None = None) -> bool:
    """Apply a purchase FSM transition if allowed; record it. Caller holds the lock."""
    method = getattr(purchase, name)
    from django_fsm import can_proceed

    if not can_proceed(method):
        return False
    source = purchase.status
    method()
    if purchase.status == source:
        return False
    purchase.save(update_fields=["status", "updated_at"])
    _history(purchase_id=purchase.id, operation=None, field="status", source=source,
             target=purchase.status, cause=cause, evidence=evidence, actor=actor)
    return True


def _op_to(op: PaymentOperation, name: str, *, cause: str, actor: str = "",
           evidence: dict | None = None, fields: tuple = ()) -> None:
    source = op.outcome
    getattr(op, name)()
    op.save(update_fields=["outcome", "stage", "updated_at", *fields])
    _history(purchase_id=op.purchase_id, operation=op, field="outcome", source=source,
             target=op.outcome, cause=cause, evidence=evidence, actor=actor)


# -- quotes and purchases -----------------------------------------------------------------
def quote_create(*, api_client: ApiClient | None, items: list[dict], currency: str) -> Quote:
    currency = (currency or "").lower()
    if not items:
        raise DomainError("invalid_items", "A quote needs at least one item.", status=422,
                          retry=RetryAdvice.NEW_OPERATION)
    lines, amount = [], 0
    skus = [str(i.get("sku", "")) for i in items]
    products = {p.sku: p for p in Product.objects.filter(sku__in=skus)}
    # Duplicate SKU lines are merged into one line (quantities added) before any check:
    # stock is checked, reserved and committed per line, so two lines of one SKU would
    # pass the stock check twice yet be reserved once (issue 15, "also check").
    merged: dict[str, int] = {}
    for item in items:
        qty = item.get("quantity")
        if not isinstance(qty, int) or isinstance(qty, bool) or not 1 <= qty <= 1000:
            raise DomainError("invalid_quantity", "Quantity must be an integer 1-1000.",
                              status=422, retry=RetryAdvice.NEW_OPERATION)
        sku = str(item.get("sku", ""))
        merged[sku] = merged.get(sku, 0) + qty
    for sku, qty in merged.items():
        product = products.get(sku)
        if product is None:
            raise DomainError("unknown_sku", f"No product with sku {sku!r}.", status=422,
                              retry=RetryAdvice.NEW_OPERATION)
        if qty > 1000:
            raise DomainError("invalid_quantity", f"Quantity of {sku} must be 1-1000 in "
                              "total.", status=422, retry=RetryAdvice.NEW_OPERATION)
        if product.currency != currency:
            raise DomainError("currency_mismatch",
                              f"{sku} is priced in {product.currency}, not {currency}.",
                              status=422, retry=RetryAdvice.NEW_OPERATION)
        if product.stock < qty:
            raise DomainError("out_of_stock", f"{sku} has {product.stock} in stock.",
                              status=409, retry=RetryAdvice.NEW_OPERATION)
        lines.append({"sku": sku, "name": product.name, "quantity": qty,
                      "unit_price": product.price})
        amount += product.price * qty
    if amount <= 0:
        raise DomainError("invalid_items", "A quote must have a positive amount.", status=422,
                          retry=RetryAdvice.NEW_OPERATION)
    return Quote.objects.create(api_client=api_client, items=lines, amount=amount,
                                currency=currency, expires_at=timezone.now() + QUOTE_TTL)


@dataclass(frozen=True)
class PurchaseOpened:
    purchase: Purchase
    created: bool  # False: the quote already backed this purchase (the same intent)


# A later purchase for the same buyer and basket is a probable duplicate of one in these
# states (money taken, or about to be); failed, refunded, voided, cancelled, expired ones
# moved no money and do not block.
_DUPLICATE_OF_STATUSES = (PurchaseStatus.PAID, PurchaseStatus.FULFILLING,
                          PurchaseStatus.COMPLETED, *UNRESOLVED_STATUSES)
_EMAIL_MAX = 254


def _code_hash(code: str) -> str:
    return hashlib.sha256("".join(code.split()).replace("-", "").upper().encode()).hexdigest()


def _duplicate_window(items: list) -> timedelta | None:
    """None: never twice. The longest window of any product in the basket."""
    skus = [str(i.get("sku", "")) for i in items if isinstance(i, dict)]
    window = settings.DUPLICATE_PURCHASE_WINDOW_SECONDS
    for product in Product.objects.filter(sku__in=skus).only("never_twice",
                                                             "duplicate_window_seconds"):
        if product.never_twice:
            return None
        if product.duplicate_window_seconds is not None:
            window = max(window, product.duplicate_window_seconds)
    return timedelta(seconds=window)


def _buyer_lifted(*, code: str, candidates) -> BuyerConfirmation:
    confirmation = (BuyerConfirmation.objects.select_for_update()
                    .filter(code_hash=_code_hash(code), used_at__isnull=True,
                            expires_at__gt=timezone.now(),
                            purchase__in=candidates).first())
    if confirmation is None:
        raise DomainError("invalid_buyer_confirmation",
                          "This buyer confirmation is not valid for this customer (unknown, "
                          "used or expired). Ask the buyer to confirm again on the earlier "
                          "purchase's status page.", status=422, retry=RetryAdvice.FORBIDDEN)
    return confirmation


def purchase_open(*, api_client: ApiClient | None, quote_id: str, quote_version: int,
                  customer_reference: str, customer_email: str = "",
                  acknowledge_unresolved=(), buyer_confirmation: str = "",
                  storefront_confirmation: bool = False) -> PurchaseOpened:
    """Open the purchase a quote backs: one quote, one purchase (a repeat returns it).

    The guards, per API client and normalised customer reference: another purchase is
    refused while the buyer has an unresolved one (`customer_has_unresolved_purchase`), or
    a paid/unresolved/awaiting one with the same basket inside the window
    (`probable_duplicate_purchase`). Only the buyer lifts them: `buyer_confirmation` (the
    single-use code from the earlier purchase's status page), or — for a storefront whose
    own checkout asked the buyer (`storefront_confirmation`, never over MCP) — naming the
    earlier purchase in `acknowledge_unresolved`.
    """
    reference = customer_reference_clean(customer_reference)
    if not reference or len(reference) > 200:
        raise DomainError("invalid_request", "customer.reference is required (at most 200 "
                          "characters).", status=400, retry=RetryAdvice.NEW_OPERATION)
    email = (customer_email or "").strip()
    if email:
        try:
            # RFC 5321 limits: the address at most 254, its local part at most 64.
            if len(email) > _EMAIL_MAX or len(email.rpartition("@")[0]) > 64:
                raise ValidationError("too long")
            validate_email(email)
        except ValidationError:
            raise DomainError("invalid_email", "customer.email is not a valid e-mail address "
                              f"(at most {_EMAIL_MAX} characters).", status=422,
                              retry=RetryAdvice.NEW_OPERATION) from None
    key = customer_key(reference)
    with transaction.atomic():
        quote = Quote.objects.select_for_update().filter(id=quote_id).first()
        if quote is None or (api_client is not None and quote.api_client_id not in
                             (None, api_client.id)):
            raise DomainError("quote_not_found", "No such quote.", status=404,
                              retry=RetryAdvice.NEW_QUOTE)
        # Under the quote's row lock: the purchase this quote already backs is this call's
        # purchase, whatever its customer fields say (the unique constraint backs it up).
        existing = Purchase.objects.filter(quote=quote).first()
        if existing is not None:
            if existing.api_client_id != (api_client.id if api_client else None):
                # A client-less quote another client already used: never name its purchase.
                raise DomainError("quote_not_found", "No such quote.", status=404,
                                  retry=RetryAdvice.NEW_QUOTE)
            return PurchaseOpened(existing, False)
        if quote.superseded_at or quote.version != quote_version:
            raise DomainError("quote_superseded", "This quote was superseded; get a new quote.",
                              status=409, retry=RetryAdvice.NEW_QUOTE)
        if quote.expires_at <= timezone.now():
            raise DomainError("quote_expired", "This quote expired; get a new quote.",
                              status=409, retry=RetryAdvice.NEW_QUOTE)
        _check_currency_allowed(api_client, quote.currency)
        lock_customer(api_client.pk if api_client else None, key)
        now = timezone.now()
        mine = Purchase.objects.filter(customer_key=key, api_client=api_client)
        fingerprint = basket_fingerprint(items=quote.items, amount=quote.amount,
                                         currency=quote.currency)
        lifted: set[str] = set()
        if storefront_confirmation:
            lifted |= {str(p) for p in acknowledge_unresolved or ()}
        confirmation = None
        if buyer_confirmation:
            confirmation = _buyer_lifted(code=buyer_confirmation, candidates=mine)
            lifted.add(confirmation.purchase_id)
        unresolved = [pid for pid in mine.filter(status__in=UNRESOLVED_STATUSES)
                      .order_by("created_at").values_list("id", flat=True) if pid not in lifted]
        if unresolved:
            raise DomainError(
                "customer_has_unresolved_purchase",
                "This customer has a purchase whose payment is not settled yet; the provider "
                "may have charged the buyer. Do not open another purchase: follow that "
                "purchase. Only the buyer can ask for a second one, on that purchase's status "
                "page.", status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.BUYER,
                purchase=unresolved[0], extra={"unresolved": unresolved})
        window = _duplicate_window(quote.items)
        same = mine.filter(basket_fingerprint=fingerprint).exclude(id__in=lifted)
        if window is not None:
            same = same.filter(created_at__gte=now - window)
        earlier = (same.filter(Q(status__in=_DUPLICATE_OF_STATUSES)
                               | Q(status=PurchaseStatus.AWAITING_PAYMENT,
                                   quote__superseded_at__isnull=True,
                                   quote__expires_at__gt=now))
                   .order_by("-created_at").first())
        if earlier is not None:
            raise DomainError(
                "probable_duplicate_purchase",
                f"This customer already has purchase {earlier.id} for the same items and "
                f"amount (status {earlier.status}). Do not open another purchase: ask the "
                "buyer whether they really want to buy the same items again; only the buyer "
                "can confirm that, on that purchase's status page.",
                status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.BUYER,
                purchase=earlier.id,
                extra={"earlier_purchase": {"id": earlier.id, "status": str(earlier.status),
                                            "created_at": earlier.created_at.isoformat()},
                       "never_twice": window is None})
        try:
            with transaction.atomic():
                purchase = Purchase.objects.create(
                    quote=quote, api_client=api_client, amount=quote.amount,
                    currency=quote.currency, customer_reference=reference, customer_key=key,
                    basket_fingerprint=fingerprint, customer_email=email,
                    recovery_owner=settings.RECOVERY_OWNER_DEFAULT,
                    acknowledged_unresolved=sorted(lifted))
        except IntegrityError:  # unreachable under the quote lock; the constraint is the guard
            return PurchaseOpened(Purchase.objects.get(quote=quote), False)
        if confirmation is not None:
            confirmation.used_at = now
            confirmation.used_for = purchase.id
            confirmation.save(update_fields=["used_at", "used_for"])
        _history(purchase_id=purchase.id, operation=None, field="status", source="",
                 target=purchase.status, cause="purchase_created",
                 evidence={"quote": quote.id, "version": quote.version,
                           **({"buyer_confirmed": confirmation.purchase_id}
                              if confirmation else {}),
                           **({"storefront_confirmed": sorted(lifted)}
                              if lifted and confirmation is None else {})},
                 actor=api_client.name if api_client else "")
    return PurchaseOpened(purchase, True)


def purchase_create(*, api_client: ApiClient | None, quote_id: str, quote_version: int,
                    customer_reference: str, customer_email: str = "",
                    acknowledge_unresolved=(), buyer_confirmation: str = "",
                    storefront_confirmation: bool = False) -> Purchase:
    """purchase_open, for callers that only need the purchase."""
    return purchase_open(api_client=api_client, quote_id=quote_id, quote_version=quote_version,
                         customer_reference=customer_reference, customer_email=customer_email,
                         acknowledge_unresolved=acknowledge_unresolved,
                         buyer_confirmation=buyer_confirmation,
                         storefront_confirmation=storefront_confirmation).purchase


def buyer_confirmation_issue(*, purchase_id: str) -> str:
    """The buyer's "yes, start a new purchase" on this purchase's status page: a single-use
    code the buyer gives the storefront. Only the hash is stored."""
    code = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(10))
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        BuyerConfirmation.objects.create(
            purchase=purchase, code_hash=_code_hash(code),
            expires_at=timezone.now() + timedelta(
                seconds=settings.BUYER_CONFIRMATION_TTL_SECONDS))
        _history(purchase_id=purchase.id, operation=None, field="status",
                 source=purchase.status, target=purchase.status,
                 cause="buyer_confirmed_new_purchase", actor="buyer:status_page")
    return f"{code[:5]}-{code[5:]}"


# No 0/O, 1/I/L: the buyer reads it off a page and types it or says it to an agent.
_CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"


def purchase_transition(*, purchase_id: str, name: str, cause: str, actor: str = "") -> Purchase:
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        _purchase_to(purchase, name, cause=cause, actor=actor)
    return purchase


def purchase_cancel(*, purchase_id: str, api_client: ApiClient | None = None,
                    acting_user=None, reason: str = "") -> Purchase:
    """`cancelled` (DESIGN §10.12): by the buyer or support before any payment was
    claimed — only failures the provider confirmed may precede it (a person's "failed"
    could still be overturned). Cancelling a cancelled purchase is a no-op."""
    with transaction.atomic():
        purchase = Purchase.objects.select_for_update(of=("self",)).filter(id=purchase_id).first()
        if purchase is None or (api_client is not None and purchase.api_client_id not in
                                (None, api_client.id)):
            raise DomainError("not_found", "No such purchase.", status=404)
        if purchase.status == PurchaseStatus.CANCELLED:
            return purchase
        claimed = purchase.operations.exclude(outcome=Outcome.FAILED, grade=Grade.CONFIRMED)
        if claimed.exists() or purchase.status not in (PurchaseStatus.AWAITING_PAYMENT,
                                                       PurchaseStatus.PAYMENT_FAILED):
            raise DomainError(
                "cancel_not_allowed", f"This purchase is {purchase.status}: a payment was "
                "claimed, so it can no longer be cancelled (ask for a refund or void "
                "instead).", status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.SUPPORT,
                purchase=purchase.id)
        actor = _actor(api_client, acting_user)
        _purchase_to(purchase, "mark_cancelled", cause="purchase_cancelled", actor=actor,
                     evidence={"reason": reason} if reason else None)
    return purchase


def purchases_expire_stale() -> int:
    """`expired`: the quote expired before any payment was claimed (DESIGN §10.12)."""
    count = 0
    ids = Purchase.objects.filter(status=PurchaseStatus.AWAITING_PAYMENT,
                                  quote__expires_at__lt=timezone.now()).values_list("id", flat=True)
    for pid in list(ids[:500]):
        with transaction.atomic():
            purchase = lock_purchase(pid)
            if purchase.operations.exists():
                continue
            count += _purchase_to(purchase, "mark_expired", cause="quote_expired")
    return count


# -- creating operations -------------------------------------------------------------------
def _active_op(purchase: Purchase) -> PaymentOperation | None:
    return purchase.operations.filter(outcome__in=SLOT_HOLDING_OUTCOMES).first()


def _dispatch_backstop(op: PaymentOperation) -> None:
    """The caller dispatches right after commit; if its process dies first, this delayed
    outbox message sends the queued operation anyway (a second dispatch is a no-op), so a
    `pending` operation never holds its purchase's slot forever."""
    outbox_put(category=OutboxCategory.DISPATCH, payload={"operation": op.id},
               dedupe_key=f"dispatch-backstop:{op.id}",  # never absorbs a prompt dispatch
               delay_seconds=settings.IDEMPOTENCY_LEASE_SECONDS + 5)


def _create_op(**fields) -> PaymentOperation:
    """Insert under a savepoint: the partial unique indexes are the real guard. A queued
    (pending) operation gets its dispatch backstop in the same transaction."""
    try:
        with transaction.atomic():
            op = PaymentOperation.objects.create(**fields)
            if op.outcome == Outcome.PENDING:
                _dispatch_backstop(op)
            return op
    except IntegrityError as exc:
        purchase_id = fields["purchase"].id
        raise DomainError(
            "payment_unresolved", "Another payment operation on this purchase is in progress.",
            status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.RECONCILIATION,
            purchase=purchase_id) from exc


def _check_currency(purchase: Purchase, currency: str | None) -> None:
    """Strict money requests (DESIGN §6): a currency other than the quote's is refused, never
    silently replaced by the quote's."""
    if currency is not None and currency.lower() != purchase.currency.lower():
        raise DomainError("currency_mismatch",
                          f"This purchase is priced in {purchase.currency}, not "
                          f"{currency.lower()}; nothing was charged.", status=422,
                          retry=RetryAdvice.FORBIDDEN, purchase=purchase.id,
                          extra={"expected_currency": purchase.currency})


def payment_create(*, purchase_id: str, api_client: ApiClient | None, payment_method: str,
                   capture_method: str = "automatic", retry_of: str | None = None,
                   amount: int | None = None, currency: str | None = None,
                   rail: str = Rail.STRIPE) -> PaymentOperation:
    if _halted("checkout"):
        raise DomainError("workflow_halted", "Checkout is paused by an operator; try later with "
                          "the same Idempotency-Key.", status=503, retry=RetryAdvice.SAME_KEY,
                          owner=Owner.SUPPORT, purchase=purchase_id)
    if capture_method not in ("automatic", "manual"):
        raise DomainError("invalid_request", "capture must be automatic or manual.", status=400,
                          retry=RetryAdvice.NEW_OPERATION, purchase=purchase_id)
    if not payment_method or len(payment_method) > 100:
        raise DomainError("invalid_request", "payment_method is required (a provider token).",
                          status=400, retry=RetryAdvice.NEW_OPERATION, purchase=purchase_id)
    if rail == Rail.STRIPE and not PAYMENT_METHOD_TOKEN.fullmatch(payment_method):
        # Verity never holds card data: anything but a provider token (a card number above
        # all) is refused here, before it is stored, logged or sent; the message never
        # repeats the value.
        raise DomainError("invalid_payment_method", "payment_method must be a provider "
                          "payment-method token (pm_… or tok_…), never card details.",
                          status=400, retry=RetryAdvice.NEW_OPERATION, purchase=purchase_id)
    if retry_of and not transaction.get_connection().in_atomic_block:
        # Called outside a transaction: read the original back here (callers that bind an
        # idempotency key in their transaction call operations_verify_before_follow_up first).
        operations_verify_before_follow_up(purchase_id=purchase_id)
    with transaction.atomic():
        purchase = Purchase.objects.select_for_update(of=("self",)).filter(id=purchase_id).first()
        if purchase is None or (api_client is not None and purchase.api_client_id not in
                                (None, api_client.id)):
            raise DomainError("not_found", "No such purchase.", status=404,
                              retry=RetryAdvice.FORBIDDEN)
        _check_currency(purchase, currency)
        _check_currency_allowed(api_client, purchase.currency)
        if amount is not None and amount != purchase.amount:
            raise DomainError("amount_mismatch",
                              f"The amount comes from the accepted quote ({purchase.amount} "
                              f"{purchase.currency}); a different amount is refused.",
                              status=422, retry=RetryAdvice.FORBIDDEN, purchase=purchase.id)
        paid = purchase.operations.filter(kind__in=PAYMENT_KINDS, outcome=Outcome.SUCCEEDED,
                                          is_duplicate=False).first()
        if retry_of and paid is not None and paid.id == retry_of:
            raise DomainError("original_succeeded", "The payment this retry names did "
                              "succeed at the provider (its earlier failure was a person's "
                              "call, since overturned). Do not pay again.", status=409,
                              retry=RetryAdvice.FORBIDDEN, owner=Owner.NONE,
                              purchase=purchase.id, operation=paid.id)
        if paid:
            raise DomainError("already_paid", "This purchase is already paid.", status=409,
                              retry=RetryAdvice.FORBIDDEN, owner=Owner.NONE,
                              purchase=purchase.id, operation=paid.id)
        active = _active_op(purchase)
        if active:
            raise DomainError(
                "payment_unresolved",
                "A payment on this purchase is not settled yet; the provider may have applied "
                "it. Do not retry: poll the operation.", status=409,
                retry=RetryAdvice.FORBIDDEN, owner=Owner.RECONCILIATION,
                purchase=purchase.id, operation=active.id)
        if purchase.status in (PurchaseStatus.EXPIRED, PurchaseStatus.CANCELLED) or (
                purchase.quote.expires_at <= timezone.now()):
            raise DomainError("quote_expired", "The quote behind this purchase expired; get a "
                              "new quote.", status=409, retry=RetryAdvice.NEW_QUOTE,
                              purchase=purchase.id)
        last_failed = (purchase.operations.filter(kind__in=PAYMENT_KINDS, outcome=Outcome.FAILED)
                       .order_by("-created_at").first())
        original = None
        if retry_of:
            original = purchase.operations.filter(id=retry_of).first()
            if original is None or original.kind not in PAYMENT_KINDS:
                raise DomainError("retry_of_not_found", "retry_of must name a payment "
                                  "operation of this purchase.", status=422,
                                  retry=RetryAdvice.FORBIDDEN, purchase=purchase.id)
            if original.outcome != Outcome.FAILED:
                raise DomainError("retry_not_allowed", "Only a failed operation can be retried.",
                                  status=409, retry=RetryAdvice.FORBIDDEN,
                                  purchase=purchase.id, operation=original.id)
            if PaymentOperation.objects.filter(retry_of=original).exists():
                raise DomainError("already_retried", "This operation was already retried once.",
                                  status=409, retry=RetryAdvice.FORBIDDEN,
                                  purchase=purchase.id, operation=original.id)
            if (original.reason == Reason.CARD_DECLINED
                    and original.payment_method == payment_method):
                raise DomainError("retry_needs_new_method", "The card was declined; retry with "
                                  "a different payment_method.", status=422,
                                  retry=RetryAdvice.NEW_OPERATION, purchase=purchase.id,
                                  operation=original.id)
            if (original.reason in NON_RETRYABLE_REASONS
                    and original.payment_method == payment_method):
                # Sent again unchanged it fails the same way (a retry chain that never
                # converges): something must change first.
                raise DomainError("retry_needs_new_method", "The provider refused this payment "
                                  "as invalid; retry only with a different payment_method, "
                                  "or start from a new quote.", status=422,
                                  retry=RetryAdvice.NEW_QUOTE, purchase=purchase.id,
                                  operation=original.id)
        elif last_failed is not None:
            raise DomainError("retry_of_required", "The last payment failed; name it in "
                              "retry_of to try again on purpose.", status=409,
                              retry=RetryAdvice.NEW_OPERATION, purchase=purchase.id,
                              operation=last_failed.id)
        attempts = purchase.operations.filter(kind__in=PAYMENT_KINDS).count()
        if attempts >= settings.PAYMENT_ATTEMPTS_MAX:
            raise DomainError("payment_attempts_exhausted",
                              f"This purchase already had {attempts} payment attempts; no "
                              "more are made. Support will contact the buyer.", status=409,
                              retry=RetryAdvice.FORBIDDEN, owner=Owner.SUPPORT,
                              purchase=purchase.id, operation=original.id if original else None)
        _check_limit(api_client, purchase.amount)
        kind = OperationKind.AUTHORIZE if capture_method == "manual" else OperationKind.CHARGE
        op = _create_op(
            purchase=purchase, kind=kind, amount=purchase.amount, currency=purchase.currency,
            payment_method=payment_method, capture_method=capture_method, retry_of=original,
            rail=rail,
            requested_by_client=api_client,
            request_fingerprint=_fingerprint({"purchase": purchase.id, "kind": kind,
                                              "amount": purchase.amount,
                                              "currency": purchase.currency,
                                              "payment_method": payment_method}))
        _history(purchase_id=purchase.id, operation=op, field="outcome", source="",
                 target=op.outcome, cause="operation_created",
                 actor=api_client.name if api_client else "")
        _purchase_to(purchase, "mark_payment_pending", cause="payment_started")
    return op


def _captured_amount(purchase: Purchase) -> int:
    """What the purchase's own payment captured (a duplicate and its return excluded)."""
    total = 0
    for op in (purchase.operations.filter(outcome=Outcome.SUCCEEDED, is_duplicate=False)
               .exclude(parent__is_duplicate=True)):
        if op.kind == OperationKind.CHARGE or op.kind == OperationKind.CAPTURE:
            total += op.amount
    return total


def _purchase_refunds(purchase: Purchase):
    """Refunds of the purchase's own payment (not the compensation of a duplicate)."""
    return purchase.operations.filter(kind=OperationKind.REFUND).exclude(
        parent__is_duplicate=True)


def _fulfilment_started(purchase_id: str) -> bool:
    from recovery.models import Order, StepRun, StepState

    return (Order.objects.filter(purchase_id=purchase_id).exists()
            or StepRun.objects.filter(purchase_id=purchase_id, state=StepState.DONE).exists())


def _linked_create(*, purchase_id: str, kind: str, api_client, acting_user,
                   halt: str, compensation: bool = False,
                   after_fulfilment: bool = False) -> PaymentOperation:
    if _halted(halt):
        raise DomainError("workflow_halted", f"The {halt} workflow is paused.", status=503,
                          retry=RetryAdvice.SAME_KEY, owner=Owner.SUPPORT, purchase=purchase_id)
    if not transaction.get_connection().in_atomic_block:
        operations_verify_before_follow_up(purchase_id=purchase_id)
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        if api_client is not None and purchase.api_client_id not in (None, api_client.id):
            raise DomainError("not_found", "No such purchase.", status=404)
        auth = purchase.operations.filter(kind=OperationKind.AUTHORIZE, outcome=Outcome.SUCCEEDED,
                                          is_duplicate=False).first()
        done = purchase.operations.filter(kind__in=[OperationKind.CAPTURE, OperationKind.VOID],
                                          outcome=Outcome.SUCCEEDED,
                                          parent__is_duplicate=False).first()
        if auth is None or done is not None:
            raise DomainError("not_capturable" if kind == OperationKind.CAPTURE else
                              "not_voidable", "There is no open authorization on this "
                              "purchase.", status=409, retry=RetryAdvice.FORBIDDEN,
                              owner=Owner.NONE, purchase=purchase.id,
                              operation=done.id if done else None)
        if (kind == OperationKind.VOID and not compensation and not after_fulfilment
                and _fulfilment_started(purchase.id)):
            # Goods may be out: a void now would leave them unpaid (issue 15 defect 5).
            raise DomainError(
                "fulfilment_started", "Fulfilment of this purchase has started, so its "
                "authorization can no longer be voided here. Capture it instead, or ask "
                "support to void it in the console (with a reason): that also cancels the "
                "order.", status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.SUPPORT,
                purchase=purchase.id, operation=auth.id)
        active = _active_op(purchase)
        if active:
            raise DomainError("payment_unresolved", "Another operation on this purchase is "
                              "not settled yet.", status=409, retry=RetryAdvice.FORBIDDEN,
                              owner=Owner.RECONCILIATION, purchase=purchase.id,
                              operation=active.id)
        op = _create_op(purchase=purchase, kind=kind, amount=auth.amount, currency=auth.currency,
                        parent=auth, provider_reference=auth.provider_reference,
                        requested_by_client=api_client, requested_by_user=acting_user,
                        is_compensation=compensation)
        _history(purchase_id=purchase.id, operation=op, field="outcome", source="",
                 target=op.outcome, cause="operation_created", actor=_actor(api_client,
                                                                           acting_user))
    return op


def capture_create(*, purchase_id: str, api_client=None, acting_user=None) -> PaymentOperation:
    return _linked_create(purchase_id=purchase_id, kind=OperationKind.CAPTURE,
                          api_client=api_client, acting_user=acting_user, halt="checkout")


def void_create(*, purchase_id: str, api_client=None, acting_user=None,
                compensation: bool = False, after_fulfilment: bool = False) -> PaymentOperation:
    """`compensation` is set in the creating transaction (a crash cannot lose it).
    `after_fulfilment`: an operator's decision (console, audited) to void although
    fulfilment started; the API never passes it (409 `fulfilment_started`)."""
    return _linked_create(purchase_id=purchase_id, kind=OperationKind.VOID,
                          api_client=api_client, acting_user=acting_user, halt="refunds",
                          compensation=compensation, after_fulfilment=after_fulfilment)


def _actor(api_client, acting_user) -> str:
    if acting_user is not None:
        return acting_user.get_username()
    return api_client.name if api_client is not None else "system"


def refund_request(*, purchase_id: str, amount: int | None = None, api_client=None,
                   acting_user=None, compensation: bool = False,
                   currency: str | None = None) -> PaymentOperation:
    """A refund starts `awaiting_approval` unless it is a compensation or within the
    client's automatic-refund allowance (DESIGN §10.8)."""
    if _halted("refunds"):
        raise DomainError("workflow_halted", "Refunds are paused by an operator.", status=503,
                          retry=RetryAdvice.SAME_KEY, owner=Owner.SUPPORT, purchase=purchase_id)
    if not transaction.get_connection().in_atomic_block:
        operations_verify_before_follow_up(purchase_id=purchase_id)
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        if api_client is not None and purchase.api_client_id not in (None, api_client.id):
            raise DomainError("not_found", "No such purchase.", status=404)
        _check_currency(purchase, currency)
        payment = purchase.operations.filter(kind__in=PAYMENT_KINDS, outcome=Outcome.SUCCEEDED,
                                             is_duplicate=False).first()
        captured = _captured_amount(purchase)
        refunded = (_purchase_refunds(purchase).exclude(outcome=Outcome.FAILED)
                    .aggregate(s=Sum("amount"))["s"] or 0)
        refundable = captured - refunded
        amount = refundable if amount is None else amount
        if payment is None or captured <= 0:
            raise DomainError("not_refundable", "Nothing was captured on this purchase.",
                              status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.NONE,
                              purchase=purchase.id)
        if payment.rail == Rail.X402:
            # No reversal exists on a chain: the money goes back as a separate transfer from
            # Verity's address to the payer, made and recorded by an operator (issue 21).
            raise DomainError("refund_is_a_transfer_back", "This purchase was paid over x402: "
                              "a refund is a separate transfer back to the payer that an "
                              "operator approves and sends; there is no void.", status=409,
                              retry=RetryAdvice.FORBIDDEN, owner=Owner.SUPPORT,
                              purchase=purchase.id, operation=payment.id)
        if not isinstance(amount, int) or amount <= 0 or amount > refundable:
            raise DomainError("refund_exceeds_refundable",
                              f"Refundable now: {refundable} {purchase.currency}.", status=422,
                              retry=RetryAdvice.FORBIDDEN, owner=Owner.NONE,
                              purchase=purchase.id, extra={"refundable": refundable})
        auto = compensation or (api_client is not None and acting_user is None
                                and _auto_refund_allowed(purchase=purchase,
                                                         api_client=api_client, amount=amount))
        op = _create_op(purchase=purchase, kind=OperationKind.REFUND, amount=amount,
                        currency=purchase.currency, parent=payment,
                        requested_by_client=api_client, requested_by_user=acting_user,
                        is_compensation=compensation,
                        outcome=Outcome.PENDING if auto else Outcome.AWAITING_APPROVAL)
        _history(purchase_id=purchase.id, operation=op, field="outcome", source="",
                 target=op.outcome, cause="refund_requested",
                 evidence={"compensation": compensation}, actor=_actor(api_client, acting_user))
    return op


# Outcomes of an automatic refund that still count against the allowance: everything but
# "never approved" (awaiting approval, declined) and "failed" (nothing left the account).
_AUTO_REFUND_COUNTED = (Outcome.PENDING, Outcome.DISPATCHING, Outcome.SUCCEEDED,
                        Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER)


def _auto_refunds(**filters) -> int:
    """Sum of automatic refunds (no person requested or approved them, not compensations)."""
    return (PaymentOperation.objects.filter(
        kind=OperationKind.REFUND, is_compensation=False, requested_by_user__isnull=True,
        approved_by_user__isnull=True, outcome__in=_AUTO_REFUND_COUNTED, **filters)
        .aggregate(s=Sum("amount"))["s"] or 0)


def _auto_refund_allowed(*, purchase: Purchase, api_client: ApiClient, amount: int) -> bool:
    """The automatic-refund allowance is cumulative (issue 25 #1): five refunds of 500 under
    a 500 allowance are 2 500 refunded without a person. Counted per payment under the
    purchase lock, and per client per period under the client's row lock (purchase ->
    client is the lock order), so two concurrent requests cannot both fit."""
    allowance = api_client.auto_refund_limit
    if amount <= 0 or allowance <= 0:
        return False
    if _auto_refunds(purchase=purchase) + amount > allowance:
        return False
    client = lock_client(api_client.id)
    start = _period_start(client) or timezone.now() - timedelta(days=1)
    period_cap = allowance * settings.AUTO_REFUND_PERIOD_MULTIPLE
    return _auto_refunds(requested_by_client=client, created_at__gte=start) + amount \
        <= period_cap


def _lock_or_404(operation_id: str) -> tuple[Purchase, PaymentOperation]:
    try:
        return lock_purchase_and_operation(operation_id)
    except PaymentOperation.DoesNotExist:
        raise DomainError("not_found", "No such operation.", status=404) from None


def refund_approve(*, operation_id: str, acting_user, reason: str,
                   audit: bool = True) -> PaymentOperation:
    """`audit=False` is for a caller that writes the one (richer) audit row of this action
    in the same transaction (the console: IP, before/after)."""
    if not (reason or "").strip():
        raise DomainError("reason_required", "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        if op.outcome != Outcome.AWAITING_APPROVAL:
            raise DomainError("not_awaiting_approval", "This refund is not awaiting approval.",
                              status=409, operation=op.id, purchase=purchase.id)
        if acting_user is None or op.requested_by_user_id == acting_user.id:
            raise DomainError("approver_is_requester", "The person who requested a refund "
                              "cannot approve it.", status=403, operation=op.id,
                              purchase=purchase.id, owner=Owner.SUPPORT)
        if _active_op(purchase):
            raise DomainError("payment_unresolved", "Another operation on this purchase is "
                              "not settled yet.", status=409, operation=op.id,
                              purchase=purchase.id, owner=Owner.RECONCILIATION)
        # Money may have moved since the request (a refund made outside Verity is booked
        # as an external operation): re-check refundable under the lock (no over-refund).
        others = (purchase.operations.filter(kind=OperationKind.REFUND).exclude(pk=op.pk)
                  .exclude(outcome=Outcome.FAILED).aggregate(s=Sum("amount"))["s"] or 0)
        refundable = _captured_amount(purchase) - others
        if op.amount > refundable:
            raise DomainError("refund_exceeds_refundable",
                              f"Refundable now: {max(refundable, 0)} {purchase.currency}.",
                              status=422, operation=op.id, purchase=purchase.id,
                              owner=Owner.SUPPORT, extra={"refundable": max(refundable, 0)})
        op.approved_by_user = acting_user
        _op_to(op, "approve", cause="refund_approved", actor=acting_user.get_username(),
               evidence={"reason": reason}, fields=("approved_by_user",))
        _dispatch_backstop(op)
        if audit:
            _audit(actor=acting_user.get_username(), action="refund_approve", op=op,
                   reason=reason)
    return op


def refund_decline(*, operation_id: str, reason: str, actor: str, acting_user=None,
                   acting_client=None) -> PaymentOperation:
    """Finance declines a refund awaiting approval: it settles `failed` (`refund_declined`,
    graded acknowledged: a person's decision, nothing at the provider), which frees the
    refundable amount. Reason required; audited in the same transaction."""
    if not (reason or "").strip():
        raise DomainError("reason_required", "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        if op.kind != OperationKind.REFUND or op.outcome != Outcome.AWAITING_APPROVAL:
            raise DomainError("not_awaiting_approval", "This refund is not awaiting approval.",
                              status=409, operation=op.id, purchase=purchase.id,
                              owner=Owner.NONE)
        _apply_locked(purchase, op, Outcome.FAILED, grade=Grade.ACKNOWLEDGED,
                      verification=Verification.MANUAL, cause="refund_declined", actor=actor,
                      evidence={"reason": reason}, reason=Reason.REFUND_DECLINED)
        _audit(actor=actor, action="refund_decline", op=op, reason=reason,
               detail={"amount": op.amount, "client": acting_client.name if acting_client
                       else None})
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def _audit(*, actor: str, action: str, op: PaymentOperation, reason: str,
           detail: dict | None = None) -> None:
    from support.models import AuditEntry

    AuditEntry.objects.create(actor=actor, action=action, target_type="operation",
                              target_id=op.id, purchase_id=op.purchase_id, reason=reason,
                              detail=detail or {})


# -- spending limits ---------------------------------------------------------------------
def _period_start(client: ApiClient, now=None):
    now = now or timezone.now()
    if client.limit_period == LimitPeriod.DAY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if client.limit_period == LimitPeriod.MONTH:
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


def client_limits(client: ApiClient) -> dict:
    """limit, consumed, reserved, unknown_exposure (current period; a hold counts in the
    period it was reserved in until it settles)."""
    start = _period_start(client)
    # One limit, one currency: only holds in the client's currency count against it.
    holds = Hold.objects.filter(api_client=client, currency__iexact=client.currency)
    consumed_q = holds.filter(state=HoldState.CONSUMED)
    if start is not None:
        consumed_q = consumed_q.filter(period_start=start)
    reserved_q = holds.filter(state=HoldState.RESERVED)
    consumed = consumed_q.aggregate(s=Sum("amount"))["s"] or 0
    reserved = reserved_q.aggregate(s=Sum("amount"))["s"] or 0
    unknown = (reserved_q.filter(operation__outcome=Outcome.UNKNOWN)
               .aggregate(s=Sum("amount"))["s"] or 0)
    return {"limit": client.spending_limit, "currency": client.currency, "consumed": consumed,
            "reserved": reserved, "unknown_exposure": unknown,
            "available": (max(client.spending_limit - consumed - reserved, 0)
                          if client.spending_limit else None),
            "period": client.limit_period}


def _check_currency_allowed(client: ApiClient | None, currency: str) -> None:
    """A client's spending limit is kept in one currency, its own: holds are never summed
    across currencies as raw minor units, and a purchase in a currency the client has no
    limit for is refused (DESIGN §6, issue 15 #9)."""
    if client is not None and currency.lower() != (client.currency or "").lower():
        raise DomainError("currency_not_allowed",
                          f"This API client's spending limit is in {client.currency}; a "
                          f"purchase in {currency.lower()} is not allowed.", status=422,
                          retry=RetryAdvice.FORBIDDEN, owner=Owner.SUPPORT,
                          extra={"allowed_currencies": [client.currency]})


def _check_limit(client: ApiClient | None, amount: int) -> None:
    if client is None or not client.spending_limit:
        return
    figures = client_limits(client)
    if figures["consumed"] + figures["reserved"] + amount > client.spending_limit:
        raise DomainError("spending_limit_exceeded", "This API client's spending limit does not "
                          "cover this amount.", status=409, retry=RetryAdvice.FORBIDDEN,
                          owner=Owner.SUPPORT, extra={"limits": figures})


def _hold_client(op: PaymentOperation) -> ApiClient | None:
    if op.requested_by_client_id:
        return op.requested_by_client
    if op.kind != OperationKind.REFUND:
        return op.purchase.api_client
    return None


def _hold_reserve(op: PaymentOperation) -> bool:
    """Reserve at the claim, under the client's row lock. False = limit exceeded."""
    client = _hold_client(op)
    if client is None:
        return True
    client = lock_client(client.id)
    if client.spending_limit:
        figures = client_limits(client)
        if figures["consumed"] + figures["reserved"] + op.amount > client.spending_limit:
            return False
    Hold.objects.bulk_create([Hold(api_client=client, operation=op, amount=op.amount,
                                   currency=op.currency, period_start=_period_start(client))],
                             ignore_conflicts=True)
    return True


def _hold_settle(op: PaymentOperation, *, succeeded: bool) -> None:
    """consume on charge/capture success; release on failure, void, or manual failed."""
    if op.kind in (OperationKind.CHARGE, OperationKind.REFUND):
        Hold.objects.filter(operation=op, state=HoldState.RESERVED).update(
            state=HoldState.CONSUMED if succeeded else HoldState.RELEASED,
            updated_at=timezone.now())
    elif op.kind == OperationKind.AUTHORIZE and not succeeded:
        Hold.objects.filter(operation=op, state=HoldState.RESERVED).update(
            state=HoldState.RELEASED, updated_at=timezone.now())
    elif op.kind == OperationKind.CAPTURE and succeeded:
        Hold.objects.filter(operation_id=op.parent_id, state=HoldState.RESERVED).update(
            state=HoldState.CONSUMED, updated_at=timezone.now())
    elif op.kind == OperationKind.VOID and succeeded:
        Hold.objects.filter(operation_id=op.parent_id, state=HoldState.RESERVED).update(
            state=HoldState.RELEASED, updated_at=timezone.now())


# -- applying what the provider said -----------------------------------------------------
def _expected_amount(op: PaymentOperation) -> int:
    if op.kind in (OperationKind.CAPTURE, OperationKind.VOID) and op.parent_id:
        return op.parent.amount
    return op.amount


def _mismatch(op: PaymentOperation, obj: ProviderObject) -> str:
    """Why this provider object cannot be this operation's, or ''."""
    expected_type = "refund" if op.kind == OperationKind.REFUND else "payment_intent"
    if op.rail == Rail.X402 and op.kind in PAYMENT_KINDS:
        expected_type = X402_OBJECT_TYPE
    if obj.object_type != expected_type:
        return f"object type {obj.object_type}"
    # x402: the authorization (payer, nonce) is the identity; its transaction hash may only
    # become known later (AuthorizationUsed log), so the hash is not compared.
    if op.provider_reference and obj.id != op.provider_reference and op.rail != Rail.X402:
        return "provider reference"
    meta = obj.metadata or {}
    allowed_ops = {op.id, op.parent_id} if op.parent_id else {op.id}
    if meta.get("operation_id") and meta["operation_id"] not in allowed_ops:
        return "operation metadata"
    if meta.get("purchase_id") and meta["purchase_id"] != op.purchase_id:
        return "purchase"
    if (meta.get("customer_reference")
            and meta["customer_reference"] != op.purchase.customer_reference):
        return "customer reference"
    if obj.amount != _expected_amount(op):
        return "amount"
    if obj.currency.lower() != op.currency.lower():
        return "currency"
    expected_accounts = {"", settings.STRIPE_ACCOUNT or "", op.provider_account or ""}
    if (obj.account or "") not in expected_accounts:
        return "account"
    return ""


_FAIL_REASONS = {"card_declined": Reason.CARD_DECLINED, "generic_decline": Reason.CARD_DECLINED,
                 "insufficient_funds": Reason.CARD_DECLINED,
                 # x402 (payments.providers.x402): stable reasons, passed through
                 **{r.value: r for r in (Reason.AUTHORIZATION_EXPIRED,
                                         Reason.AUTHORIZATION_CANCELED,
                                         Reason.AUTHORIZATION_INVALID,
                                         Reason.INSUFFICIENT_BALANCE,
                                         Reason.PROVIDER_UNREACHABLE)}}


def _settle_effects_refund(purchase: Purchase, op: PaymentOperation, *, cause: str,
                           actor: str) -> None:
    refunded = (_purchase_refunds(purchase).filter(outcome=Outcome.SUCCEEDED)
                .aggregate(s=Sum("amount"))["s"] or 0)
    if refunded >= _captured_amount(purchase):
        _purchase_to(purchase, "mark_refunded", cause=cause, actor=actor)
    else:
        _restore_after_refund(purchase, op, cause=cause, actor=actor)


def _settle_effects(purchase: Purchase, op: PaymentOperation, *, cause: str, actor: str) -> None:
    """What follows an outcome change: holds, purchase status, outbox. Same transaction."""
    o = op.outcome
    if o in (Outcome.SUCCEEDED, Outcome.FAILED):
        _hold_settle(op, succeeded=o == Outcome.SUCCEEDED)
        outbox_put(category=OutboxCategory.OPERATION_SETTLED, payload={"operation": op.id},
                   dedupe_key=f"settled:{op.id}")
    if op.kind in PAYMENT_KINDS and op.is_duplicate:
        if o == Outcome.SUCCEEDED:
            duplicate_compensate_locked(purchase=purchase, duplicate=op)
        return  # a duplicate never pays (or un-pays) the purchase
    if op.parent_id and op.parent.is_duplicate:
        return  # returning a duplicate changes nothing the customer bought
    if op.kind in PAYMENT_KINDS:
        name = {Outcome.SUCCEEDED: "mark_paid", Outcome.FAILED: "mark_payment_failed",
                Outcome.UNKNOWN: "mark_payment_unknown",
                Outcome.AWAITING_BUYER: "mark_action_required",
                Outcome.AWAITING_PROVIDER: "mark_payment_pending"}.get(o)
        if name and _purchase_to(purchase, name, cause=cause, actor=actor) and o == Outcome.SUCCEEDED:
            outbox_put(category=OutboxCategory.RUN_STEPS, payload={"purchase": purchase.id},
                       dedupe_key=f"steps:{purchase.id}")
    elif op.kind == OperationKind.VOID and o == Outcome.SUCCEEDED:
        _purchase_to(purchase, "mark_voided", cause=cause, actor=actor)
    elif op.kind == OperationKind.REFUND:
        if o == Outcome.SUCCEEDED:
            _settle_effects_refund(purchase, op, cause=cause, actor=actor)
        elif o == Outcome.FAILED:
            _restore_after_refund(purchase, op, cause=cause, actor=actor)
        elif o == Outcome.AWAITING_PROVIDER:
            _purchase_to(purchase, "mark_refund_pending", cause=cause, actor=actor)


_RESTORABLE = (PurchaseStatus.PAID, PurchaseStatus.FULFILLING, PurchaseStatus.COMPLETED,
               PurchaseStatus.MANUAL_REVIEW)


def _restore_after_refund(purchase: Purchase, op: PaymentOperation, *, cause: str,
                          actor: str) -> None:
    """`refund_pending` only while a refund is in flight (DESIGN §5.10): once the last one
    settles without refunding everything, the purchase goes back to the status it had
    before, with the refund's outcome and reason on the transition; a paid purchase
    resumes fulfilment. Caller holds the purchase lock."""
    if purchase.status != PurchaseStatus.REFUND_PENDING:
        return
    if purchase.operations.filter(kind=OperationKind.REFUND,
                                  outcome__in=SLOT_HOLDING_OUTCOMES).exclude(id=op.id).exists():
        return  # another refund is still in flight
    before = (OperationTransition.objects
              .filter(purchase_id=purchase.id, operation__isnull=True, field="status",
                      target=PurchaseStatus.REFUND_PENDING)
              .exclude(source=PurchaseStatus.REFUND_PENDING)
              .order_by("-id").values_list("source", flat=True).first())
    prior = before if before in _RESTORABLE else PurchaseStatus.PAID
    source = purchase.status
    purchase.restore_after_refund(prior)
    purchase.save(update_fields=["status", "updated_at"])
    _history(purchase_id=purchase.id, operation=None, field="status", source=source,
             target=purchase.status, cause=f"refund_{op.outcome}:{cause}",
             evidence={"refund": op.id, "outcome": op.outcome, "reason": op.reason,
                       "amount": op.amount}, actor=actor)
    if purchase.status in (PurchaseStatus.PAID, PurchaseStatus.FULFILLING):
        outbox_put(category=OutboxCategory.RUN_STEPS, payload={"purchase": purchase.id},
                   dedupe_key=f"steps:{purchase.id}")
# Provider statuses that never change again for the operation they settle (an event
# carrying one may overturn a person's resolution without a read-back first).
_FINAL_STATUSES = frozenset({"succeeded", "requires_capture", "canceled", "failed"})


def _other_payment_success(op: PaymentOperation) -> PaymentOperation | None:
    return (PaymentOperation.objects.filter(purchase_id=op.purchase_id, kind__in=PAYMENT_KINDS,
                                            outcome=Outcome.SUCCEEDED, is_duplicate=False)
            .exclude(id=op.id).first())


def _voided_by_verity(op: PaymentOperation) -> bool:
    return PaymentOperation.objects.filter(parent=op, kind=OperationKind.VOID).exclude(
        outcome=Outcome.FAILED).exists()


def _hold_overturn(op: PaymentOperation, *, succeeded: bool) -> None:
    """Holds follow an overturned outcome, whatever state the person's outcome left."""
    now = timezone.now()
    if op.kind in (OperationKind.CHARGE, OperationKind.REFUND):
        rows, state = Hold.objects.filter(operation=op), (
            HoldState.CONSUMED if succeeded else HoldState.RELEASED)
    elif op.kind == OperationKind.AUTHORIZE:
        rows, state = Hold.objects.filter(operation=op), (
            HoldState.RESERVED if succeeded else HoldState.RELEASED)
    elif op.kind == OperationKind.CAPTURE:
        rows, state = Hold.objects.filter(operation_id=op.parent_id), (
            HoldState.CONSUMED if succeeded else HoldState.RESERVED)
    else:  # void
        rows, state = Hold.objects.filter(operation_id=op.parent_id), (
            HoldState.RELEASED if succeeded else HoldState.RESERVED)
    rows.update(state=state, updated_at=now)


def _overturned_resolution(op: PaymentOperation) -> dict:
    """Who resolved it by hand, when, and why (from the history row of the resolution)."""
    row = (op.transitions.filter(cause="manual_resolution").order_by("-created_at", "-id")
           .first())
    if row is None:
        return {"outcome": op.outcome, "actor": "", "at": None, "reason": ""}
    return {"outcome": op.outcome, "actor": row.actor,
            "at": row.created_at.isoformat().replace("+00:00", "Z"),
            "reason": (row.evidence or {}).get("reason", "")}


def _overturn_locked(purchase: Purchase, op: PaymentOperation, target: Outcome, *,
                     verification: str, cause: str, actor: str, evidence: dict, reason: str,
                     obj: ProviderObject | None) -> ApplyResult:
    """Verified provider evidence contradicts an acknowledged outcome: the operation takes
    the provider's outcome, graded confirmed; holds, the purchase and a console queue item
    follow. Caller holds both locks."""
    overturned = _overturned_resolution(op)
    source = op.outcome
    fields = ["outcome", "stage", "grade", "verification", "reason", "provider_status",
              "provider_reference", "provider_charge", "settled_at", "next_action_owner",
              "is_duplicate", "updated_at"]
    if obj is not None:
        op.provider_status = obj.status
        op.provider_reference = op.provider_reference or obj.id
        op.provider_charge = obj.latest_charge or op.provider_charge
    op.grade, op.verification, op.settled_at = Grade.CONFIRMED, verification, timezone.now()
    op.next_action_owner = Owner.SUPPORT  # a person must look at what followed their call
    if target == Outcome.SUCCEEDED:
        op.reason = ""
        if op.kind in PAYMENT_KINDS and _other_payment_success(op):
            op.is_duplicate = True
        op.overturn_to_succeeded()
    else:
        op.reason = reason or _FAIL_REASONS.get(obj.failure_code if obj else "",
                                                Reason.PROVIDER_FAILED)
        op.overturn_to_failed()
    op.save(update_fields=fields)
    _history(purchase_id=purchase.id, operation=op, field="outcome", source=source,
             target=op.outcome, cause=OVERTURN_CAUSE,
             evidence={"overturned": overturned, "by": cause, "verification": verification,
                       "provider": evidence}, actor=actor)
    _hold_overturn(op, succeeded=target == Outcome.SUCCEEDED)
    # The earlier settled message was processed: a new one (own key) resumes the work.
    outbox_put(category=OutboxCategory.OPERATION_SETTLED, payload={"operation": op.id},
               dedupe_key=f"settled:{op.id}:overturn:{op.outcome}")
    log.warning("manual resolution overturned operation=%s from=%s to=%s by=%s",
                op.id, source, op.outcome, cause)
    review = "mark_manual_review"
    if op.kind in PAYMENT_KINDS:
        if target == Outcome.SUCCEEDED:
            if op.is_duplicate:
                duplicate_compensate_locked(purchase=purchase, duplicate=op)
            elif _purchase_to(purchase, "mark_paid", cause=OVERTURN_CAUSE, actor=actor):
                outbox_put(category=OutboxCategory.RUN_STEPS, payload={"purchase": purchase.id},
                           dedupe_key=f"steps:{purchase.id}")
        else:
            # Shown paid (perhaps fulfilled) on a person's word; the provider says no money
            # came: a person decides what to unwind.
            _purchase_to(purchase, review, cause=OVERTURN_CAUSE, actor=actor)
    elif op.kind == OperationKind.VOID:
        _purchase_to(purchase, "mark_voided" if target == Outcome.SUCCEEDED else review,
                     cause=OVERTURN_CAUSE, actor=actor)
    elif op.kind == OperationKind.REFUND:
        if target == Outcome.SUCCEEDED:
            _settle_effects_refund(purchase, op, cause=OVERTURN_CAUSE, actor=actor)
        elif purchase.status == PurchaseStatus.REFUNDED:
            _purchase_to(purchase, review, cause=OVERTURN_CAUSE, actor=actor)
    elif op.kind == OperationKind.CAPTURE and target == Outcome.FAILED:
        _purchase_to(purchase, review, cause=OVERTURN_CAUSE, actor=actor)
    return ApplyResult.APPLIED


def duplicate_compensate_locked(*, purchase: Purchase, duplicate: PaymentOperation
                                ) -> PaymentOperation | None:
    """The linked refund (or void, for an authorization) that returns a duplicate charge:
    its own operation and key, dispatched through the outbox and reconciled like any
    other. None while another operation holds the purchase's slot (the settled handler
    tries again). Caller holds the purchase lock."""
    existing = (PaymentOperation.objects.filter(parent=duplicate, is_compensation=True)
                .exclude(outcome=Outcome.FAILED).first())
    if existing is not None:
        return existing
    kind = OperationKind.VOID if duplicate.kind == OperationKind.AUTHORIZE else OperationKind.REFUND
    try:
        with transaction.atomic():
            comp = PaymentOperation.objects.create(
                purchase=purchase, kind=kind, amount=duplicate.amount,
                currency=duplicate.currency, parent=duplicate, is_compensation=True,
                provider_reference=(duplicate.provider_reference
                                    if kind == OperationKind.VOID else ""))
            _dispatch_backstop(comp)
            outbox_put(category=OutboxCategory.DISPATCH, payload={"operation": comp.id},
                       dedupe_key=f"dispatch:{comp.id}")
    except IntegrityError:
        return None
    _history(purchase_id=purchase.id, operation=comp, field="outcome", source="",
             target=comp.outcome, cause="duplicate_compensation",
             evidence={"duplicate": duplicate.id}, actor="system")
    return comp


def duplicate_compensation_ensure(*, operation_id: str) -> PaymentOperation | None:
    """Idempotent: make sure a confirmed duplicate has its compensation. Raises
    DomainError `payment_unresolved` while the purchase's slot is busy (retry later)."""
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id)
        if not (op.is_duplicate and op.outcome == Outcome.SUCCEEDED):
            return None
        comp = duplicate_compensate_locked(purchase=purchase, duplicate=op)
        if comp is None:
            raise DomainError("payment_unresolved", "Another operation on this purchase is "
                              "not settled yet; the duplicate's refund waits for it.",
                              status=409, retry=RetryAdvice.SAME_KEY,
                              owner=Owner.RECONCILIATION, purchase=purchase.id,
                              operation=op.id)
        return comp


def _schedule_reconcile(op: PaymentOperation, *, first: bool) -> None:
    schedule = settings.RECONCILE_SCHEDULE_SECONDS
    now = timezone.now()
    if first:
        op.reconcile_attempts = 0
        op.reconcile_deadline = now + timedelta(seconds=settings.RECONCILE_DEADLINE_SECONDS)
    delay = schedule[min(op.reconcile_attempts, len(schedule) - 1)]
    op.next_reconcile_at = now + timedelta(seconds=delay)
    op.next_action_owner = Owner.RECONCILIATION
    op.save(update_fields=["reconcile_attempts", "reconcile_deadline", "next_reconcile_at",
                           "next_action_owner", "updated_at"])
    outbox_put(category=OutboxCategory.RECONCILE, payload={"operation": op.id},
               dedupe_key=f"reconcile:{op.id}", delay_seconds=delay)


def _apply_locked(purchase: Purchase, op: PaymentOperation, target: Outcome, *, grade: str,
                  verification: str, cause: str, actor: str, evidence: dict,
                  reason: str = "", obj: ProviderObject | None = None,
                  final: bool = True) -> ApplyResult:
    """`final`: the evidence is the provider's last word on this object (a read-back, or
    an event whose status cannot change any more); only final evidence overturns a
    person's resolution, anything else is a conflict settled by a read-back."""
    current = op.outcome
    if current in (Outcome.SUCCEEDED, Outcome.FAILED):
        if target == current:
            if op.grade == Grade.ACKNOWLEDGED and grade == Grade.CONFIRMED:
                op.grade, op.verification = grade, verification  # evidence upgrades a manual
                op.save(update_fields=["grade", "verification", "updated_at"])
                _history(purchase_id=purchase.id, operation=op, field="outcome",
                         source=current, target=current, cause=f"confirmed:{cause}"[:64],
                         evidence=evidence, actor=actor)
                return ApplyResult.APPLIED
            return ApplyResult.NO_CHANGE
        if target in (Outcome.SUCCEEDED, Outcome.FAILED):
            if op.grade == Grade.ACKNOWLEDGED and grade == Grade.CONFIRMED and final:
                # The provider's record outranks a person (DESIGN §4, invariant 8).
                return _overturn_locked(purchase, op, target, verification=verification,
                                        cause=cause, actor=actor, evidence=evidence,
                                        reason=reason, obj=obj)
            return ApplyResult.CONFLICT
        return ApplyResult.STALE  # a late non-terminal never regresses a terminal outcome
    if target == current:
        return ApplyResult.NO_CHANGE
    fields = ["grade", "verification", "reason", "provider_status", "provider_reference",
              "provider_charge", "next_action_owner", "settled_at"]
    if obj is not None:
        op.provider_status = obj.status
        op.provider_reference = op.provider_reference or obj.id
        op.provider_charge = obj.latest_charge or op.provider_charge
    if target == Outcome.SUCCEEDED and op.kind in PAYMENT_KINDS and _other_payment_success(op):
        # A second confirmed charge on one purchase: the one confirmed later is the
        # duplicate; it is recorded as the provider did it and compensated (invariant 8).
        op.is_duplicate = True
        fields.append("is_duplicate")
    if target in (Outcome.SUCCEEDED, Outcome.FAILED):
        op.grade, op.verification = grade, verification
        op.settled_at = timezone.now()
        op.next_action_owner = Owner.NONE
        op.next_reconcile_at = None
        fields.append("next_reconcile_at")
        if target == Outcome.FAILED:
            op.reason = reason or _FAIL_REASONS.get(obj.failure_code if obj else "",
                                                    Reason.PROVIDER_FAILED)
            if op.kind in PAYMENT_KINDS:
                op.next_action_owner = Owner.BUYER
        name = "settle_succeeded" if target == Outcome.SUCCEEDED else "settle_failed"
    elif target == Outcome.AWAITING_BUYER:
        op.next_action_owner, name = Owner.BUYER, "mark_awaiting_buyer"
    elif target == Outcome.AWAITING_PROVIDER:
        op.next_action_owner, name = Owner.RECONCILIATION, "mark_awaiting_provider"
    elif target == Outcome.UNKNOWN:
        op.next_action_owner, name = Owner.RECONCILIATION, "mark_unknown"
    else:
        return ApplyResult.NO_CHANGE
    _op_to(op, name, cause=cause, actor=actor, evidence=evidence, fields=tuple(fields))
    if target in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER):
        _schedule_reconcile(op, first=current not in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER,
                                                      Outcome.AWAITING_BUYER))
    _settle_effects(purchase, op, cause=cause, actor=actor)
    return ApplyResult.APPLIED


def operation_apply_observation(*, operation_id: str, obj: ProviderObject, source: str,
                                cause: str, actor: str = "") -> ApplyResult:
    """THE one place a provider observation (sync answer, read-back, webhook) changes an
    operation. Checks that the object is this operation's before anything is applied."""
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id)
        why = _mismatch(op, obj)
        if why:
            _history(purchase_id=purchase.id, operation=op, field="outcome", source=op.outcome,
                     target=op.outcome, cause=f"mismatch:{why}", evidence=obj.safe_fields(),
                     actor=actor)
            return ApplyResult.MISMATCH
        target = outcome_from_object(obj, kind=op.kind)
        if target is None:
            return ApplyResult.NO_CHANGE
        if (op.kind == OperationKind.AUTHORIZE and obj.status == "canceled"
                and op.outcome == Outcome.SUCCEEDED and _voided_by_verity(op)):
            # A canceled PaymentIntent after Verity's own void agrees with Verity: the
            # authorization did succeed, and the void cancelled it (issue 15 defect 10).
            return ApplyResult.NO_CHANGE
        final = source == Verification.PROVIDER or obj.status in _FINAL_STATUSES
        return _apply_locked(purchase, op, target, grade=Grade.CONFIRMED, verification=source,
                             cause=cause, actor=actor, evidence=obj.safe_fields(), obj=obj,
                             final=final)


def _settle_without_object(operation_id: str, target: Outcome, *, reason: str, cause: str,
                           evidence: dict | None = None,
                           verification: str = Verification.UNVERIFIED) -> None:
    """failed with evidence that is not an object (not_sent thrice, declined without
    object, never confirmed) or unknown."""
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id)
        grade = Grade.CONFIRMED if target == Outcome.FAILED else Grade.NONE
        _apply_locked(purchase, op, target, grade=grade, verification=verification,
                      cause=cause, actor="dispatcher", evidence=evidence or {}, reason=reason)


# -- dispatch: claim in a transaction, call outside, apply in a transaction ---------------
def _provider():
    from .providers.stripe import get_provider

    return get_provider()


def _claim(operation_id: str, step: str, *, attempt: int = 1, from_pending: bool = False,
           confirm: bool = False) -> ProviderCall | None:
    """Phase 1. Returns the claimed ProviderCall, or None if someone else owns the step or
    the operation moved on (e.g. the dead-dispatch sweep settled it)."""
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id)
        if from_pending:
            if op.outcome != Outcome.PENDING:
                return None
            # A halt binds at claim time, under the lock (DESIGN §5.9): queued work of
            # every kind (a backstop, an approved refund, a compensation) waits here, still
            # `pending`, and goes out once the halt clears. It does not fail.
            if _halted(operation_workflow(op.kind)):
                raise _HaltedAtClaim(operation_workflow(op.kind))
            op.dispatch_deadline = timezone.now() + timedelta(
                seconds=settings.DISPATCH_LEASE_SECONDS)
            _op_to(op, "start_dispatch", cause=f"claim:{step}", actor="dispatcher",
                   fields=("dispatch_deadline",))
        elif op.outcome != Outcome.DISPATCHING:
            return None
        try:
            with transaction.atomic():
                call = ProviderCall.objects.create(
                    operation=op, purpose=CallPurpose.DISPATCH, step=step, attempt=attempt,
                    key=op.provider_key(step))
        except IntegrityError:
            return None  # invariant 2: this step was already claimed
        if confirm or (from_pending and op.kind == OperationKind.REFUND):
            if not _hold_reserve(op):
                _apply_locked(purchase, op, Outcome.FAILED, grade=Grade.CONFIRMED,
                              verification=Verification.UNVERIFIED, cause="limit_at_claim",
                              actor="dispatcher", evidence={},
                              reason="spending_limit_exceeded")
                call.delete()
                return None
        if confirm:
            op.confirm_claimed_at = timezone.now()
            op.save(update_fields=["confirm_claimed_at", "updated_at"])
        return call


def operation_claim_write(*, operation_id: str, step: str) -> ProviderCall | None:
    """Phase 1 for a rail whose one write is made by its own service (x402 settle): the
    pending operation starts dispatching, the step is claimed once (invariant 2) and the
    hold reserved, in the caller's transaction."""
    return _claim(operation_id, step, from_pending=True, confirm=True)


def _record_call(call: ProviderCall, result: CallResult) -> None:
    ProviderCall.objects.filter(id=call.id).update(
        http_status=result.http_status, classification=result.classification,
        request_id=result.request_id[:100], error_code=result.error_code[:64],
        fault_drill=result.fault_drill, finished_at=timezone.now(),
        safe_fields=result.object.safe_fields() if result.object else {"detail": result.detail})


def _send(operation_id: str, step: str, first_call: ProviderCall, fn) -> CallResult:
    """Phase 2, outside any transaction. Resends the same step key only for answers that
    prove nothing was applied (not_sent, 429/should-retry), each resend claimed anew."""
    call, attempt = first_call, 1
    while True:
        assert_no_transaction_outside_transaction()
        result = fn()
        _record_call(call, result)
        resend = (result.classification == Classification.NOT_SENT and attempt <= NOT_SENT_RESENDS
                  ) or (result.classification == Classification.RETRYABLE
                        and attempt <= RETRYABLE_RESENDS)
        if not resend:
            return result
        if result.classification == Classification.RETRYABLE:
            # Outside any transaction (phase 2), so the wait holds no lock.
            delay = min(RETRYABLE_BACKOFF_BASE_SECONDS * 2 ** (attempt - 1),
                        RETRYABLE_BACKOFF_CAP_SECONDS)
            time.sleep(delay * (1 + random.random() * 0.1))
        attempt += 1
        call = _claim(operation_id, step, attempt=attempt)
        if call is None:
            return CallResult(Classification.IN_FLIGHT)


def _outcome_after_call(op: PaymentOperation, step: str, result: CallResult) -> None:
    """Phase 3 for a money-moving step's answer."""
    cls = result.classification
    if cls == Classification.IN_FLIGHT:
        return
    if cls == Classification.OK and result.object is not None:
        applied = operation_apply_observation(operation_id=op.id, obj=result.object,
                                              source=Verification.PROVIDER,
                                              cause=f"{step}_answer")
        current = PaymentOperation.objects.values_list("outcome", flat=True).get(id=op.id)
        if applied == ApplyResult.MISMATCH or current == Outcome.DISPATCHING:
            _settle_without_object(op.id, Outcome.UNKNOWN, reason="", cause=f"{step}_no_verdict",
                                   evidence=result.object.safe_fields())
        return
    if cls == Classification.DECLINED:
        if result.object is not None:
            operation_apply_observation(operation_id=op.id, obj=result.object,
                                        source=Verification.PROVIDER, cause=f"{step}_declined")
        current = PaymentOperation.objects.values_list("outcome", flat=True).get(id=op.id)
        if current == Outcome.DISPATCHING:
            _settle_without_object(op.id, Outcome.FAILED, reason=Reason.CARD_DECLINED,
                                   cause=f"{step}_declined", verification=Verification.PROVIDER,
                                   evidence={"http_status": result.http_status,
                                             "code": result.error_code})
        return
    if cls in (Classification.NOT_SENT, Classification.RETRYABLE):
        # Provably not applied, resends exhausted: fail with evidence (retry: new_operation).
        _settle_without_object(op.id, Outcome.FAILED, reason=Reason.PROVIDER_UNREACHABLE,
                               cause=f"{step}_{cls}", evidence={"classification": cls})
        return
    if cls == Classification.REJECTED:
        # A 4xx on a non-create step: the object decides (e.g. a second confirm is a bare
        # 400 at localstripe, yet the first may have succeeded).
        read = _read_back(PaymentOperation.objects.get(id=op.id))
        if read.classification == Classification.OK and read.object is not None:
            operation_apply_observation(operation_id=op.id, obj=read.object,
                                        source=Verification.PROVIDER, cause=f"{step}_readback")
        current = PaymentOperation.objects.values_list("outcome", flat=True).get(id=op.id)
        if current == Outcome.DISPATCHING:
            _settle_without_object(op.id, Outcome.UNKNOWN, reason="",
                                   cause=f"{step}_rejected_no_verdict",
                                   evidence={"http_status": result.http_status})
        return
    _settle_without_object(op.id, Outcome.UNKNOWN, reason="", cause=f"{step}_{cls}",
                           evidence={"http_status": result.http_status,
                                     "fault_drill": result.fault_drill, "detail": result.detail})


def _metadata(op: PaymentOperation) -> dict:
    return {"operation_id": op.id, "purchase_id": op.purchase_id,
            "customer_reference": op.purchase.customer_reference}


def _dispatch_payment(op: PaymentOperation) -> None:
    provider = _provider()
    call = _claim(op.id, CallStep.CREATE, from_pending=True)
    if call is None:
        return
    result = _send(op.id, CallStep.CREATE, call, lambda: provider.create_payment_intent(
        key=op.provider_key(CallStep.CREATE), amount=op.amount, currency=op.currency,
        payment_method=op.payment_method, capture_method=op.capture_method,
        metadata=_metadata(op)))
    if result.classification == Classification.IN_FLIGHT:
        return
    if result.classification != Classification.OK or result.object is None:
        # Create never moves money and confirm was never claimed: whatever happened, this
        # operation cannot have charged (DESIGN §10.2).
        reason = {Classification.DECLINED: Reason.CARD_DECLINED,
                  Classification.REJECTED: Reason.INVALID_REQUEST,
                  Classification.NOT_SENT: Reason.PROVIDER_UNREACHABLE,
                  Classification.RETRYABLE: Reason.PROVIDER_UNREACHABLE}.get(
            result.classification, Reason.NOT_CONFIRMED)
        _settle_without_object(op.id, Outcome.FAILED, reason=reason, cause="create_failed",
                               evidence={"classification": result.classification,
                                         "http_status": result.http_status})
        return
    with transaction.atomic():
        locked = lock_operation(op.id)
        if _mismatch(locked, result.object) in ("", "provider reference"):
            locked.provider_reference = result.object.id
            locked.save(update_fields=["provider_reference", "updated_at"])
    call = _claim(op.id, CallStep.CONFIRM, confirm=True)
    if call is None:
        return
    intent_id = result.object.id
    result = _send(op.id, CallStep.CONFIRM, call, lambda: provider.confirm_payment_intent(
        key=op.provider_key(CallStep.CONFIRM), intent_id=intent_id))
    _outcome_after_call(op, CallStep.CONFIRM, result)


_LINKED_STEP = {OperationKind.CAPTURE: CallStep.CAPTURE, OperationKind.VOID: CallStep.CANCEL,
                OperationKind.REFUND: CallStep.REFUND}


def _dispatch_linked(op: PaymentOperation) -> None:
    provider = _provider()
    step = _LINKED_STEP[op.kind]
    call = _claim(op.id, step, from_pending=True)
    if call is None:
        return
    parent_ref = op.parent.provider_reference if op.parent_id else op.provider_reference
    key = op.provider_key(step)
    if op.kind == OperationKind.CAPTURE:
        fn = lambda: provider.capture_payment_intent(key=key, intent_id=parent_ref)  # noqa: E731
    elif op.kind == OperationKind.VOID:
        fn = lambda: provider.cancel_payment_intent(key=key, intent_id=parent_ref)  # noqa: E731
    else:
        fn = lambda: provider.create_refund(key=key, intent_id=parent_ref, amount=op.amount,  # noqa: E731
                                            metadata=_metadata(op))
    result = _send(op.id, step, call, fn)
    _outcome_after_call(op, step, result)


def operation_dispatch(*, operation_id: str) -> PaymentOperation:
    """Send one operation to the provider, at most once. No transaction may be open."""
    assert_no_transaction_outside_transaction()
    op = PaymentOperation.objects.select_related("purchase", "parent").get(id=operation_id)
    if op.outcome == Outcome.PENDING:
        try:
            if op.kind in PAYMENT_KINDS:
                _dispatch_payment(op)
            else:
                _dispatch_linked(op)
        except _HaltedAtClaim as halted:
            log.info("dispatch held: workflow %s is halted operation=%s", halted, op.id)
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def operation_dispatch_or_wait(*, operation_id: str) -> PaymentOperation:
    """For the outbox: dispatch, and raise if the operation is still queued (its workflow
    is halted) so the message backs off and runs again instead of being marked done."""
    op = operation_dispatch(operation_id=operation_id)
    if op.outcome == Outcome.PENDING:
        raise DomainError("workflow_halted", f"The {operation_workflow(op.kind)} workflow is "
                          "halted; the dispatch waits.", status=503, retry=RetryAdvice.SAME_KEY,
                          owner=Owner.SUPPORT, purchase=op.purchase_id, operation=op.id)
    return op


# -- read-back -----------------------------------------------------------------------------
def _read_back(op: PaymentOperation) -> CallResult:
    """Read-only: by provider reference, else by metadata. Records a reconcile call."""
    provider = _provider()
    if op.rail == Rail.X402 and op.kind in PAYMENT_KINDS:
        # The chain, read-only: never a second settle (DESIGN §4, x402).
        step, result = CallStep.RETRIEVE, x402_read_back(op)
    elif op.kind == OperationKind.REFUND:
        if op.provider_reference:
            step, result = CallStep.RETRIEVE, provider.retrieve_refund(op.provider_reference)
        else:
            step, result = CallStep.LIST, provider.find_by_metadata(object_type="refund",
                                                                    operation_id=op.id)
    else:
        ref = op.provider_reference or (op.parent.provider_reference if op.parent_id else "")
        if ref:
            step, result = CallStep.RETRIEVE, provider.retrieve_payment_intent(ref)
        else:
            step, result = CallStep.LIST, provider.find_by_metadata(
                object_type="payment_intent", operation_id=op.parent_id or op.id)
    # A read claims nothing, so it is recorded once, after the answer (one INSERT).
    ProviderCall.objects.create(
        operation=op, purpose=CallPurpose.RECONCILE, step=step,
        attempt=min(op.reconcile_attempts + 1, 32767), http_status=result.http_status,
        classification=result.classification, request_id=result.request_id[:100],
        error_code=result.error_code[:64], fault_drill=result.fault_drill,
        finished_at=timezone.now(),
        safe_fields=result.object.safe_fields() if result.object else {"detail": result.detail})
    return result


def operation_read_canonical(*, operation_id: str) -> ProviderObject | None:
    """The provider's current record of an operation, read (and recorded as a reconcile
    call) without applying it: for a caller that must judge a conflict itself."""
    assert_no_transaction_outside_transaction()
    op = PaymentOperation.objects.select_related("purchase", "parent").get(id=operation_id)
    result = _read_back(op)
    return result.object if result.classification == Classification.OK else None


def operation_reconcile(*, operation_id: str, actor: str = "reconciler") -> PaymentOperation:
    """Read the provider's record and apply it. Never writes to the provider. Nothing
    found or provider unavailable keeps `unknown` (absence of evidence is not failure)."""
    assert_no_transaction_outside_transaction()
    op = PaymentOperation.objects.select_related("purchase", "parent").get(id=operation_id)
    # A person's (acknowledged) outcome is not the provider's: it can still be read back,
    # and the provider's record outranks it (DESIGN §4).
    if op.is_terminal and op.grade != Grade.ACKNOWLEDGED:
        raise DomainError("already_settled", f"This operation is already {op.outcome}.",
                          status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.NONE,
                          purchase=op.purchase_id, operation=op.id)
    if op.outcome in (Outcome.PENDING, Outcome.AWAITING_APPROVAL):
        raise DomainError("not_dispatched", "This operation was never sent to the provider.",
                          status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.NONE,
                          purchase=op.purchase_id, operation=op.id)
    result = _read_back(op)
    if result.classification == Classification.OK and result.object is not None:
        operation_apply_observation(operation_id=op.id, obj=result.object,
                                    source=Verification.PROVIDER, cause="reconcile",
                                    actor=actor)
    settled = PaymentOperation.objects.select_related("purchase").get(id=operation_id)
    if settled.is_terminal:
        return settled  # nothing left to schedule
    unapplied = _confirm_unapplied(settled, result)
    with transaction.atomic():
        purchase = lock_purchase(op.purchase_id)
        op = lock_operation(operation_id)
        if op.outcome in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER):
            op.reconcile_attempts += 1
            _schedule_reconcile(op, first=False)
            if unapplied and op.escalated_at is None:
                # The provider never applied the confirm and, past its in-flight window, it
                # will not by itself: reading again cannot settle it. A person decides now
                # (the console's "cancel at the provider and mark failed").
                op.stage, op.escalated_at = Stage.ESCALATED, timezone.now()
                op.next_action_owner = Owner.SUPPORT
                op.save(update_fields=["stage", "escalated_at", "next_action_owner",
                                       "updated_at"])
                _history(purchase_id=purchase.id, operation=op, field="outcome",
                         source=op.outcome, target=op.outcome, cause="escalated_unapplied_write",
                         evidence={"provider_status": result.object.status,
                                   "recovery_owner": purchase.recovery_owner}, actor=actor)
            if (op.reconcile_deadline and timezone.now() >= op.reconcile_deadline
                    and op.escalated_at is None):
                op.stage, op.escalated_at = Stage.ESCALATED, timezone.now()
                op.next_action_owner = Owner.SUPPORT
                op.save(update_fields=["stage", "escalated_at", "next_action_owner",
                                       "updated_at"])
                _history(purchase_id=purchase.id, operation=op, field="outcome",
                         source=op.outcome, target=op.outcome, cause="escalated",
                         evidence={"recovery_owner": purchase.recovery_owner}, actor=actor)
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def operation_reconcile_on_demand(*, operation_id: str, actor: str) -> int:
    """A read-back someone asked for (API, MCP). At most one per operation per
    RECONCILE_ON_DEMAND_COOLDOWN_SECONDS (issue 25 #6: 200 POSTs made 200 provider reads
    and 200 timeline rows): within the cooldown nothing is read or written and the
    caller answers the current state. Returns 0 after a read-back, else the seconds to
    wait (Retry-After). The claim is one atomic `cache.add` in the shared cache (Redis),
    so concurrent requests on any web process cannot both read."""
    from django.core.cache import cache

    cooldown = int(settings.RECONCILE_ON_DEMAND_COOLDOWN_SECONDS)
    op = PaymentOperation.objects.get(id=operation_id)
    open_for_reading = not op.is_terminal and op.outcome not in (Outcome.PENDING,
                                                                 Outcome.AWAITING_APPROVAL)
    # Settled or never sent: operation_reconcile refuses without reading (409s unchanged).
    key = f"reconcile-on-demand:{operation_id}"
    now = time.time()
    if open_for_reading and cooldown > 0:
        try:
            if not cache.add(key, now, timeout=cooldown):
                last = cache.get(key) or now
                return max(1, math.ceil(cooldown - (now - last)))
        except Exception:  # noqa: BLE001 - a cache outage must not stop a read-back
            log.warning("reconcile cooldown cache unavailable; reading back", exc_info=True)
    operation_reconcile(operation_id=operation_id, actor=actor)
    return 0
_UNAPPLIED_STATUSES = ("requires_confirmation",)


def _confirm_unapplied(op: PaymentOperation, result: CallResult) -> bool:
    """The read-back shows a confirm the provider never applied (the PaymentIntent still
    `requires_confirmation`), claimed longer ago than the provider's in-flight window."""
    return (op.kind in PAYMENT_KINDS and op.outcome == Outcome.UNKNOWN
            and result.classification == Classification.OK and result.object is not None
            and result.object.status in _UNAPPLIED_STATUSES
            and op.confirm_claimed_at is not None
            and timezone.now() - op.confirm_claimed_at
            >= timedelta(seconds=settings.PROVIDER_INFLIGHT_WINDOW_SECONDS))


def operation_cancel_unapplied(*, operation_id: str, reason: str, actor: str) -> PaymentOperation:
    """Settle an unapplied confirm: cancel the PaymentIntent at the provider, then mark the
    payment failed from the provider's own answer (grade confirmed, never a person's word).

    A write to the provider, so the three phases: (1) under the locks, check the operation
    is an unknown payment and claim the cancel step (a concurrent second cancel is refused
    by the claim's unique constraint); (2) read back, and cancel only if the confirm is
    still unapplied; (3) apply what the provider answered. Refused — nothing changes in
    Verity — if the provider applied the payment after all or the cancel fails.
    """
    if not (reason or "").strip():
        raise DomainError("reason_required", "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        if op.kind not in PAYMENT_KINDS or op.outcome != Outcome.UNKNOWN \
                or not op.provider_reference:
            raise DomainError("not_cancellable", "Only an unknown payment with a provider "
                              "reference can be cancelled here.", status=409,
                              purchase=purchase.id, operation=op.id, owner=Owner.SUPPORT)
        attempt = op.provider_calls.filter(purpose=CallPurpose.DISPATCH,
                                           step=CallStep.CANCEL).count() + 1
        try:
            with transaction.atomic():
                call = ProviderCall.objects.create(
                    operation=op, purpose=CallPurpose.DISPATCH, step=CallStep.CANCEL,
                    attempt=attempt,
                    key=(op.provider_key(CallStep.CANCEL) if attempt == 1 else
                         f"{op.idempotency_key}.{attempt}:{CallStep.CANCEL}"))
        except IntegrityError:
            raise DomainError("cancel_in_progress", "Another cancel of this payment is in "
                              "progress.", status=409, purchase=purchase.id,
                              operation=op.id, owner=Owner.SUPPORT) from None
    assert_no_transaction_outside_transaction()
    read = _read_back(op)
    if read.classification != Classification.OK or read.object is None:
        _record_call(call, CallResult(Classification.NOT_SENT, detail="read-back failed"))
        raise DomainError("cancel_failed", "The provider could not be read; nothing was "
                          "cancelled. Try again later.", status=502, purchase=op.purchase_id,
                          operation=op.id, owner=Owner.SUPPORT)
    if read.object.status not in _UNAPPLIED_STATUSES:
        _record_call(call, CallResult(Classification.REJECTED, detail="not unapplied"))
        operation_apply_observation(operation_id=op.id, obj=read.object,
                                    source=Verification.PROVIDER, cause="reconcile",
                                    actor=actor)
        raise DomainError("provider_applied", f"The provider's record is now "
                          f"{read.object.status}: the confirm was not left unapplied; nothing "
                          "was cancelled.", status=409, purchase=op.purchase_id,
                          operation=op.id, owner=Owner.SUPPORT)
    result = _provider().cancel_payment_intent(key=call.key, intent_id=op.provider_reference)
    _record_call(call, result)
    if (result.classification != Classification.OK or result.object is None
            or result.object.status != "canceled"):
        raise DomainError("cancel_failed", "The provider did not confirm the cancel; the "
                          "payment stays unknown.", status=502, purchase=op.purchase_id,
                          operation=op.id, owner=Owner.SUPPORT)
    with transaction.atomic():
        purchase, locked = _lock_or_404(operation_id)
        _apply_locked(purchase, locked, Outcome.FAILED, grade=Grade.CONFIRMED,
                      verification=Verification.PROVIDER, cause="cancelled_unapplied",
                      actor=actor, evidence={"reason": reason, **result.object.safe_fields()},
                      reason=Reason.PROVIDER_CANCELED, obj=result.object)
        _audit(actor=actor, action="operation_cancel_unapplied", op=locked, reason=reason,
               detail={"provider_status": result.object.status})
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def operations_sweep_dead_dispatches() -> int:
    """A dispatch with no recorded outcome past its lease: its worker died. Never resend:
    confirm claimed -> unknown (reconcile); confirm never claimed -> failed not_confirmed."""
    count = 0
    stale = PaymentOperation.objects.filter(outcome=Outcome.DISPATCHING,
                                            dispatch_deadline__lt=timezone.now())
    for op_id, purchase_id in list(stale.values_list("id", "purchase_id")[:500]):
        with transaction.atomic():
            purchase = lock_purchase(purchase_id)
            op = lock_operation(op_id)
            if op.outcome != Outcome.DISPATCHING or op.dispatch_deadline >= timezone.now():
                continue
            never_confirmed = op.kind in PAYMENT_KINDS and op.confirm_claimed_at is None
            target = Outcome.FAILED if never_confirmed else Outcome.UNKNOWN
            _apply_locked(purchase, op, target, grade=Grade.CONFIRMED if never_confirmed
                          else Grade.NONE, verification=Verification.UNVERIFIED,
                          cause="dead_dispatch", actor="sweeper", evidence={},
                          reason=Reason.NOT_CONFIRMED if never_confirmed else "")
            count += 1
    return count


# -- people --------------------------------------------------------------------------------
def _refuse_unresolvable(op: PaymentOperation, *, acting_client, acting_user) -> None:
    if (acting_client is not None and op.requested_by_client_id == acting_client.id) or (
            acting_user is not None and op.requested_by_user_id == acting_user.id):
        raise DomainError("resolver_is_requester", "The requester of an operation cannot "
                          "resolve it.", status=403, operation=op.id, purchase=op.purchase_id,
                          owner=Owner.SUPPORT)
    if op.outcome not in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER):
        raise DomainError("not_resolvable", f"An operation that is {op.outcome} cannot be "
                          "resolved by hand.", status=409, operation=op.id,
                          purchase=op.purchase_id, owner=Owner.NONE)


# PaymentIntent statuses a person's "failed" can be made true by cancelling first, so the
# buyer (3-D Secure) or a slow confirm cannot complete it later.
_CANCELLABLE_PI = frozenset({"requires_payment_method", "requires_confirmation",
                             "requires_action"})


def _provider_contradicts(op: PaymentOperation, obj: ProviderObject, proposed: str) -> None:
    raise DomainError(
        "provider_contradicts",
        f"The provider's record contradicts '{proposed}': it shows {obj.object_type} "
        f"{obj.id} as '{obj.status}'. That record was applied; the resolution was not.",
        status=409, retry=RetryAdvice.FORBIDDEN, owner=Owner.SUPPORT,
        purchase=op.purchase_id, operation=op.id,
        extra={"provider": {"object": obj.object_type, "id": obj.id, "status": obj.status}})


def _cancel_before_manual_failure_outside_transaction(op: PaymentOperation, *, actor: str,
                                                      reason: str) -> None:
    """Cancel the PaymentIntent at the provider before a person settles it `failed`.

    A write: claimed and audited in one transaction (three phases), refused if the
    provider does not confirm the cancel."""
    ref = op.provider_reference
    with transaction.atomic():
        purchase, locked = lock_purchase_and_operation(op.id)
        if locked.outcome not in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER,
                                  Outcome.AWAITING_BUYER):
            return
        attempt = (ProviderCall.objects.filter(operation=locked, purpose=CallPurpose.DISPATCH,
                                               step=CallStep.CANCEL).count() + 1)
        call = ProviderCall.objects.create(
            operation=locked, purpose=CallPurpose.DISPATCH, step=CallStep.CANCEL,
            attempt=attempt, key=locked.provider_key(CallStep.CANCEL))  # same key: idempotent
        _audit(actor=actor, action="operation_cancel_at_provider", op=locked, reason=reason,
               detail={"provider_reference": ref, "before_manual_failure": True})
    result = _provider().cancel_payment_intent(key=call.key, intent_id=ref)
    _record_call(call, result)
    obj = result.object
    if result.classification != Classification.OK or obj is None:
        read = _read_back(PaymentOperation.objects.select_related("purchase", "parent")
                          .get(id=op.id))
        obj = read.object if read.classification == Classification.OK else None
    if obj is not None and _mismatch(op, obj) == "":
        operation_apply_observation(operation_id=op.id, obj=obj, source=Verification.PROVIDER,
                                    cause="cancel_before_manual_failure", actor=actor)
        if outcome_from_object(obj, kind=op.kind) == Outcome.SUCCEEDED:
            _provider_contradicts(op, obj, Outcome.FAILED)
        if obj.status == "canceled":
            return
    raise DomainError(
        "provider_cancel_failed", "The provider did not confirm cancelling this payment, so "
        "it cannot be settled failed yet (the buyer could still complete it). Try again.",
        status=409, retry=RetryAdvice.SAME_KEY, owner=Owner.SUPPORT,
        purchase=op.purchase_id, operation=op.id)


def operation_resolve_manual(*, operation_id: str, outcome: str, reason: str, actor: str,
                             acting_user=None, acting_client=None,
                             bind=None, audit: bool = True) -> PaymentOperation:
    """A person settles what machines could not — after the provider was asked.

    1. read back (no transaction open): a provider record that contradicts `outcome`
       is applied and the resolution refused (409 `provider_contradicts`); one that agrees
       settles it `confirmed`; no reachable record leaves the person's word, graded
       `acknowledged`, verification `manual`;
    2. `failed` for a payment the provider still holds open (awaiting the buyer, never
       confirmed) cancels it at the provider first, audited, refused if the cancel fails;
    3. one transaction records the Resolution and audit row (and `bind(op)`, the caller's
       idempotency binding) with the outcome.
    `audit=False`: the caller writes this action's one audit row in the same transaction.
    """
    assert_no_transaction_outside_transaction()
    if not (reason or "").strip():
        raise DomainError("reason_required", "A reason is required.", status=422)
    if outcome not in (Outcome.SUCCEEDED, Outcome.FAILED):
        raise DomainError("invalid_outcome", "outcome must be succeeded or failed.", status=422)
    op = (PaymentOperation.objects.select_related("purchase", "parent")
          .filter(id=operation_id).first())
    if op is None:
        raise DomainError("not_found", "No such operation.", status=404)
    _refuse_unresolvable(op, acting_client=acting_client, acting_user=acting_user)
    read = _read_back(op)
    obj = read.object if read.classification == Classification.OK else None
    if obj is not None and _mismatch(op, obj):
        obj = None  # not this operation's record: no evidence either way
    verdict = outcome_from_object(obj, kind=op.kind) if obj is not None else None
    if verdict in (Outcome.SUCCEEDED, Outcome.FAILED):
        operation_apply_observation(operation_id=op.id, obj=obj, source=Verification.PROVIDER,
                                    cause="readback_before_resolution", actor=actor)
        if verdict != outcome:
            _provider_contradicts(op, obj, outcome)
    elif (outcome == Outcome.SUCCEEDED and op.kind in PAYMENT_KINDS and obj is not None
          and obj.status in _CANCELLABLE_PI):
        # The provider's own record shows no money moved (a confirm it never applied, a
        # buyer who never authenticated): a person's "succeeded" is contradicted, and
        # accepting it would book a sale the provider never made (found by the soak).
        _provider_contradicts(op, obj, outcome)
    elif (outcome == Outcome.FAILED and op.kind in PAYMENT_KINDS and op.provider_reference
          and (op.outcome == Outcome.AWAITING_BUYER
               or (obj is not None and obj.status in _CANCELLABLE_PI))):
        _cancel_before_manual_failure_outside_transaction(op, actor=actor, reason=reason)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        evidence_applied = op.is_terminal
        if op.is_terminal and op.outcome != outcome:
            # settled meanwhile by other evidence that says otherwise
            raise DomainError("provider_contradicts", f"The provider's record shows this "
                              f"operation {op.outcome}; the resolution was not applied.",
                              status=409, owner=Owner.SUPPORT, operation=op.id,
                              purchase=purchase.id)
        if not evidence_applied:
            _refuse_unresolvable(op, acting_client=acting_client, acting_user=acting_user)
            _apply_locked(purchase, op, Outcome(outcome), grade=Grade.ACKNOWLEDGED,
                          verification=Verification.MANUAL, cause="manual_resolution",
                          actor=actor, evidence={"reason": reason,
                                                 "provider_read": read.classification},
                          reason=Reason.MANUAL if outcome == Outcome.FAILED else "")
        from support.models import Resolution

        Resolution.objects.create(operation_id=op.id, purchase_id=purchase.id, outcome=outcome,
                                  reason=reason, actor=actor)
        if audit:
            _audit(actor=actor, action="operation_resolve", op=op, reason=reason,
                   detail={"outcome": outcome, "grade": op.grade,
                           "provider_read": read.classification})
        if bind is not None:
            bind(op)
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def operation_overturn_review(*, operation_id: str, actor: str, reason: str) -> PaymentOperation:
    """A person has looked at what followed an overturn: the queue item closes."""
    if not (reason or "").strip():
        raise DomainError("reason_required", "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        if (op.next_action_owner != Owner.SUPPORT
                or not op.transitions.filter(cause=OVERTURN_CAUSE).exists()):
            raise DomainError("not_overturned", "This operation has no overturn waiting for "
                              "review.", status=409, owner=Owner.NONE, operation=op.id,
                              purchase=purchase.id)
        op.next_action_owner = (Owner.BUYER if op.outcome == Outcome.FAILED
                                and op.kind in PAYMENT_KINDS else Owner.NONE)
        op.save(update_fields=["next_action_owner", "updated_at"])
        _history(purchase_id=purchase.id, operation=op, field="outcome", source=op.outcome,
                 target=op.outcome, cause="overturn_reviewed", evidence={"reason": reason},
                 actor=actor)
        _audit(actor=actor, action="overturn_review", op=op, reason=reason)
    return op


def operations_verify_before_follow_up(*, purchase_id: str) -> None:
    """Before a follow-up money movement (`retry_of`, capture, void, refund): read back
    every money-moving operation of the purchase whose outcome is only a person's
    (acknowledged) and apply what the provider shows — an on-the-fly reconcile, as Kill
    Bill's janitor does. The follow-up's own checks then see the provider's truth.
    No transaction may be open (network I/O)."""
    ids = list(PaymentOperation.objects.filter(
        purchase_id=purchase_id, grade=Grade.ACKNOWLEDGED,
        outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED],
        kind__in=[*PAYMENT_KINDS, OperationKind.CAPTURE, OperationKind.VOID])
        .values_list("id", flat=True))
    if not ids:
        return  # nothing only a person settled: no read needed
    assert_no_transaction_outside_transaction()
    for op_id in ids:
        try:
            operation_reconcile(operation_id=op_id, actor="follow-up-check")
        except DomainError:
            continue


def operation_replay(*, operation_id: str, actor: str, acting_client=None,
                     acting_user=None) -> PaymentOperation:
    """Resend the last write with the same provider key: only where the provider dedupes
    keys (Stripe does, within its window; localstripe does not)."""
    op = PaymentOperation.objects.filter(id=operation_id).first()
    if op is None:
        raise DomainError("not_found", "No such operation.", status=404)
    if (acting_client is not None and op.requested_by_client_id == acting_client.id) or (
            acting_user is not None and op.requested_by_user_id == acting_user.id):
        raise DomainError("replayer_is_requester", "The requester cannot replay its own "
                          "operation.", status=403, operation=op.id, purchase=op.purchase_id)
    if not settings.STRIPE_DEDUPES_KEYS or op.rail == Rail.X402:
        raise DomainError("replay_unsupported", "This provider does not deduplicate "
                          "idempotency keys, so a replay could charge twice. Reconcile "
                          "instead.", status=409, retry=RetryAdvice.FORBIDDEN,
                          owner=Owner.RECONCILIATION, operation=op.id, purchase=op.purchase_id)
    if op.outcome != Outcome.UNKNOWN:
        raise DomainError("not_replayable", "Only an unknown operation can be replayed.",
                          status=409, operation=op.id, purchase=op.purchase_id)
    if op.created_at < timezone.now() - timedelta(hours=23):
        raise DomainError("replay_window_closed", "The provider's idempotency window is over.",
                          status=409, operation=op.id, purchase=op.purchase_id)
    # With a deduplicating provider, the same key returns the original result: a read.
    return operation_reconcile(operation_id=op.id, actor=actor)
