"""Quotes and purchases: the durable identity created before any money moves,
the duplicate guard, buyer confirmations, cancel and expiry.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from ..customers import basket_fingerprint, customer_key, customer_reference_clean
from ..enums import (
    DUPLICATE_GUARD_STATUSES,
    PAYMENT_KINDS,
    UNRESOLVED_STATUSES,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    PurchaseStatus,
    RetryAdvice,
)
from ..errors import DomainError, ErrorCode
from ..locks import (
    lock_buyer_confirmation_or_none,
    lock_customer,
    lock_purchase,
    lock_purchase_or_none,
    lock_quote_or_none,
)
from ..models import ApiClient, BuyerConfirmation, Product, Purchase, PurchaseChannel, Quote
from .common import _actor, _purchase_to, transition_record
from .holds import _check_currency_allowed

if TYPE_CHECKING:
    from django.contrib.auth.models import User

QUOTE_TTL = timedelta(minutes=30)


def quote_create(
    *, api_client: ApiClient | None, items: list[dict[str, Any]], currency: str
) -> Quote:
    currency = (currency or "").lower()
    if not items:
        raise DomainError(
            ErrorCode.INVALID_ITEMS,
            "A quote needs at least one item.",
            status=422,
            retry=RetryAdvice.NEW_OPERATION,
        )
    lines, amount = [], 0
    skus = [str(i.get("sku", "")) for i in items]
    products = {p.sku: p for p in Product.objects.filter(sku__in=skus)}
    # Duplicate SKU lines are merged into one line (quantities added) before any check:
    # stock is checked, reserved and committed per line, so two lines of one SKU would
    # pass the stock check twice yet be reserved once.
    merged: dict[str, int] = {}
    for item in items:
        qty = item.get("quantity")
        if not isinstance(qty, int) or isinstance(qty, bool) or not 1 <= qty <= 1000:
            raise DomainError(
                ErrorCode.INVALID_QUANTITY,
                "Quantity must be an integer 1-1000.",
                status=422,
                retry=RetryAdvice.NEW_OPERATION,
            )
        sku = str(item.get("sku", ""))
        merged[sku] = merged.get(sku, 0) + qty
    for sku, qty in merged.items():
        product = products.get(sku)
        if product is None:
            raise DomainError(
                ErrorCode.UNKNOWN_SKU,
                f"No product with sku {sku!r}.",
                status=422,
                retry=RetryAdvice.NEW_OPERATION,
            )
        if qty > 1000:
            raise DomainError(
                ErrorCode.INVALID_QUANTITY,
                f"Quantity of {sku} must be 1-1000 in total.",
                status=422,
                retry=RetryAdvice.NEW_OPERATION,
            )
        if product.currency != currency:
            raise DomainError(
                ErrorCode.CURRENCY_MISMATCH,
                f"{sku} is priced in {product.currency}, not {currency}.",
                status=422,
                retry=RetryAdvice.NEW_OPERATION,
            )
        if product.stock < qty:
            raise DomainError(
                ErrorCode.OUT_OF_STOCK,
                f"{sku} has {product.stock} in stock.",
                status=409,
                retry=RetryAdvice.NEW_OPERATION,
            )
        lines.append(
            {"sku": sku, "name": product.name, "quantity": qty, "unit_price": product.price}
        )
        amount += product.price * qty
    if amount <= 0:
        raise DomainError(
            ErrorCode.INVALID_ITEMS,
            "A quote must have a positive amount.",
            status=422,
            retry=RetryAdvice.NEW_OPERATION,
        )
    return Quote.objects.create(
        api_client=api_client,
        items=lines,
        amount=amount,
        currency=currency,
        expires_at=timezone.now() + QUOTE_TTL,
    )


@dataclass(frozen=True)
class PurchaseOpened:
    purchase: Purchase
    created: bool  # False: the quote already backed this purchase (the same intent)


# A later purchase for the same buyer and basket is a probable duplicate of one whose money
# is held or may be (payments.enums.MONEY_HELD_STATUSES, the one definition: a refund in
# flight or a dispute open or won holds the buyer's money too); failed, refunded, voided,
# cancelled, expired and lost ones hold nothing and do not block.
_DUPLICATE_OF_STATUSES = DUPLICATE_GUARD_STATUSES


_EMAIL_MAX = 254


# A purchase that holds nothing by its STATUS (payment_failed, voided, refunded) only
# because a person said so — a payment "failed", a void or refund "succeeded", graded
# acknowledged while the provider could not be read — may still hold the buyer's money:
# the provider's read-back may overturn that word (otherwise the same basket could be
# bought twice after a person's unconfirmed "failed"). For the guard it is
# unresolved until read back, per operation (as `payment_unsettled` says of a payment).
# A purchase already held or unresolved by status is guarded by status.
_SETTLED_ON_A_PERSONS_WORD = ~Q(status__in=DUPLICATE_GUARD_STATUSES) & (
    Q(
        operations__grade=Grade.ACKNOWLEDGED,
        operations__kind__in=PAYMENT_KINDS,
        operations__outcome=Outcome.FAILED,
    )
    | Q(
        operations__grade=Grade.ACKNOWLEDGED,
        operations__kind__in=(OperationKind.VOID, OperationKind.REFUND),
        operations__outcome=Outcome.SUCCEEDED,
    )
)


def _code_hash(code: str) -> str:
    return hashlib.sha256("".join(code.split()).replace("-", "").upper().encode()).hexdigest()


def _duplicate_window(items: list[Any]) -> timedelta | None:
    """None: never twice. The longest window of any product in the basket."""
    skus = [str(i.get("sku", "")) for i in items if isinstance(i, dict)]
    window = settings.DUPLICATE_PURCHASE_WINDOW_SECONDS
    for product in Product.objects.filter(sku__in=skus).only(
        "never_twice", "duplicate_window_seconds"
    ):
        if product.never_twice:
            return None
        if product.duplicate_window_seconds is not None:
            window = max(window, product.duplicate_window_seconds)
    return timedelta(seconds=window)


def _buyer_lifted(*, code: str, candidates: QuerySet[Purchase]) -> BuyerConfirmation:
    confirmation = lock_buyer_confirmation_or_none(
        code_hash=_code_hash(code), purchases=candidates, now=timezone.now()
    )
    if confirmation is None:
        raise DomainError(
            ErrorCode.INVALID_BUYER_CONFIRMATION,
            "This buyer confirmation is not valid for this customer (unknown, "
            "used or expired). Ask the buyer to confirm again on the earlier "
            "purchase's status page; the code is e-mailed to the buyer.",
            status=422,
            retry=RetryAdvice.FORBIDDEN,
        )
    return confirmation


def purchase_open(
    *,
    api_client: ApiClient | None,
    quote_id: str,
    quote_version: int,
    customer_reference: str,
    customer_email: str = "",
    acknowledge_unresolved: Sequence[str] = (),
    buyer_confirmation: str = "",
    storefront_confirmation: bool = False,
    channel: str = PurchaseChannel.API,
) -> PurchaseOpened:
    """Open the purchase a quote backs: one quote, one purchase (a repeat returns it).

    The guards, per API client and normalised customer reference: another purchase is
    refused while the buyer has an unresolved one (`customer_has_unresolved_purchase`), or
    a paid/unresolved/awaiting one with the same basket inside the window
    (`probable_duplicate_purchase`). Only the buyer lifts them: `buyer_confirmation` (the
    single-use code the earlier purchase's status page e-mails to the buyer), or — for a storefront
    whose
    own checkout asked the buyer (`storefront_confirmation`, never over MCP) — naming the
    earlier purchase in `acknowledge_unresolved`.
    """
    reference = _customer_reference_valid(customer_reference)
    email = _customer_email_valid(customer_email)
    key = customer_key(reference)
    # No savepoint inside a caller's transaction (a keyed request's): nothing catches a
    # refusal in between, it rolls back the caller's whole transaction.
    with transaction.atomic(savepoint=False):
        quote = _quote_locked(quote_id, api_client=api_client)
        # Under the quote's row lock: the purchase this quote already backs is this call's
        # purchase, whatever its customer fields say (the unique constraint backs it up).
        existing = _purchase_of_quote(quote, api_client=api_client)
        if existing is not None:
            return PurchaseOpened(existing, False)
        _quote_still_offered(quote, quote_version=quote_version)
        _check_currency_allowed(api_client, quote.currency)
        lock_customer(api_client.pk if api_client else None, key)
        now = timezone.now()
        mine = Purchase.objects.filter(customer_key=key, api_client=api_client)
        fingerprint = basket_fingerprint(
            items=quote.items, amount=quote.amount, currency=quote.currency
        )
        lifted, confirmation = _guards_lifted(
            mine,
            acknowledge_unresolved=acknowledge_unresolved if storefront_confirmation else (),
            buyer_confirmation=buyer_confirmation,
        )
        _refuse_beside_unresolved(mine, lifted=lifted)
        _refuse_probable_duplicate(
            mine, quote=quote, fingerprint=fingerprint, lifted=lifted, now=now
        )
        return _purchase_create(
            quote=quote,
            api_client=api_client,
            reference=reference,
            key=key,
            fingerprint=fingerprint,
            email=email,
            lifted=lifted,
            confirmation=confirmation,
            channel=channel,
            now=now,
        )


def _purchase_create(
    *,
    quote: Quote,
    api_client: ApiClient | None,
    reference: str,
    key: str,
    fingerprint: str,
    email: str,
    lifted: set[str],
    confirmation: BuyerConfirmation | None,
    channel: str,
    now: datetime,
) -> PurchaseOpened:
    """The new purchase, under the quote's and the buyer's locks: the buyer's confirmation
    spent on it and its first transition recorded."""
    try:
        with transaction.atomic():
            purchase = Purchase.objects.create(
                quote=quote,
                api_client=api_client,
                amount=quote.amount,
                currency=quote.currency,
                customer_reference=reference,
                customer_key=key,
                basket_fingerprint=fingerprint,
                customer_email=email,
                recovery_owner=settings.RECOVERY_OWNER_DEFAULT,
                acknowledged_unresolved=sorted(lifted),
                channel=channel,
            )
    except IntegrityError:  # unreachable under the quote lock; the constraint is the guard
        return PurchaseOpened(Purchase.objects.get(quote=quote), False)
    if confirmation is not None:
        confirmation.used_at = now
        confirmation.used_for = purchase.id
        confirmation.save(update_fields=["used_at", "used_for"])
    transition_record(
        purchase_id=purchase.id,
        operation=None,
        field="status",
        source="",
        target=purchase.status,
        cause="purchase_created",
        evidence={
            "quote": quote.id,
            "version": quote.version,
            **({"buyer_confirmed": confirmation.purchase_id} if confirmation else {}),
            **({"storefront_confirmed": sorted(lifted)} if lifted and confirmation is None else {}),
        },
        actor=api_client.name if api_client else "",
    )
    return PurchaseOpened(purchase, True)


def _customer_reference_valid(customer_reference: str) -> str:
    reference = customer_reference_clean(customer_reference)
    if not reference or len(reference) > 200:
        raise DomainError(
            ErrorCode.INVALID_REQUEST,
            "customer.reference is required (at most 200 characters).",
            status=400,
            retry=RetryAdvice.NEW_OPERATION,
        )
    return reference


def _customer_email_valid(customer_email: str) -> str:
    email = (customer_email or "").strip()
    if email:
        try:
            # RFC 5321 limits: the address at most 254, its local part at most 64.
            if len(email) > _EMAIL_MAX or len(email.rpartition("@")[0]) > 64:
                raise ValidationError("too long")
            validate_email(email)
        except ValidationError:
            raise DomainError(
                ErrorCode.INVALID_EMAIL,
                f"customer.email is not a valid e-mail address (at most {_EMAIL_MAX} characters).",
                status=422,
                retry=RetryAdvice.NEW_OPERATION,
            ) from None
    return email


def _quote_locked(quote_id: str, *, api_client: ApiClient | None) -> Quote:
    """The quote, locked; 404 when there is none or it is another client's."""
    quote = lock_quote_or_none(quote_id)
    if quote is None or (
        api_client is not None and quote.api_client_id not in (None, api_client.id)
    ):
        raise DomainError(
            ErrorCode.QUOTE_NOT_FOUND, "No such quote.", status=404, retry=RetryAdvice.NEW_QUOTE
        )
    return quote


def _purchase_of_quote(quote: Quote, *, api_client: ApiClient | None) -> Purchase | None:
    """The purchase the (locked) quote already backs, if any."""
    existing = Purchase.objects.filter(quote=quote).first()
    if existing is not None and existing.api_client_id != (api_client.id if api_client else None):
        # A client-less quote another client already used: never name its purchase.
        raise DomainError(
            ErrorCode.QUOTE_NOT_FOUND,
            "No such quote.",
            status=404,
            retry=RetryAdvice.NEW_QUOTE,
        )
    return existing


def _quote_still_offered(quote: Quote, *, quote_version: int) -> None:
    """The quote is the version the buyer saw, and it has not expired."""
    if quote.superseded_at or quote.version != quote_version:
        raise DomainError(
            ErrorCode.QUOTE_SUPERSEDED,
            "This quote was superseded; get a new quote.",
            status=409,
            retry=RetryAdvice.NEW_QUOTE,
        )
    if quote.expires_at <= timezone.now():
        raise DomainError(
            ErrorCode.QUOTE_EXPIRED,
            "This quote expired; get a new quote.",
            status=409,
            retry=RetryAdvice.NEW_QUOTE,
        )


def _guards_lifted(
    mine: QuerySet[Purchase],
    *,
    acknowledge_unresolved: Sequence[str] | None,
    buyer_confirmation: str,
) -> tuple[set[str], BuyerConfirmation | None]:
    """The buyer's earlier purchases the guards no longer count, and the buyer's
    confirmation that lifted them (if a code was given): the purchases a storefront's own
    checkout acknowledged, or the one the buyer's code confirms and every purchase of the
    same basket opened before it."""
    lifted: set[str] = {str(p) for p in acknowledge_unresolved or ()}
    confirmation = None
    if buyer_confirmation:
        confirmation = _buyer_lifted(code=buyer_confirmation, candidates=mine)
        lifted.add(confirmation.purchase_id)
        # The buyer confirmed buying again beside purchase P: P already stood beside
        # every purchase of the same basket opened before it, so those are lifted too
        # (else, with two of them in the window, each code lifts one and the guard
        # names the other for ever: the buyer could never open a third).
        confirmed = (
            mine.filter(id=confirmation.purchase_id)
            .values_list("basket_fingerprint", "created_at")
            .first()
        )
        if confirmed is not None:
            lifted |= set(
                mine.filter(
                    basket_fingerprint=confirmed[0], created_at__lt=confirmed[1]
                ).values_list("id", flat=True)
            )
    return lifted, confirmation


def _refuse_beside_unresolved(mine: QuerySet[Purchase], *, lifted: set[str]) -> None:
    """`customer_has_unresolved_purchase`: the buyer has a purchase whose payment is not
    settled (by status, or only on a person's word) that the buyer did not lift."""
    unresolved = [
        pid
        for pid in mine.filter(Q(status__in=UNRESOLVED_STATUSES) | _SETTLED_ON_A_PERSONS_WORD)
        .distinct()
        .order_by("created_at")
        .values_list("id", flat=True)
        if pid not in lifted
    ]
    if unresolved:
        raise DomainError(
            ErrorCode.CUSTOMER_HAS_UNRESOLVED_PURCHASE,
            "This customer has a purchase whose payment is not settled yet; the provider "
            "may have charged the buyer. Do not open another purchase: follow that "
            "purchase. Only the buyer can ask for a second one, on that purchase's status "
            "page.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.BUYER,
            purchase=unresolved[0],
            extra={"unresolved": unresolved},
        )


def _refuse_probable_duplicate(
    mine: QuerySet[Purchase], *, quote: Quote, fingerprint: str, lifted: set[str], now: datetime
) -> None:
    """`probable_duplicate_purchase`: the buyer already has a paid, unresolved or awaiting
    purchase of the same basket inside the window the basket's products set."""
    window = _duplicate_window(quote.items)
    same = mine.filter(basket_fingerprint=fingerprint).exclude(id__in=lifted)
    if window is not None:
        same = same.filter(created_at__gte=now - window)
    earlier = (
        same.filter(
            Q(status__in=_DUPLICATE_OF_STATUSES)
            | Q(
                status=PurchaseStatus.AWAITING_PAYMENT,
                quote__superseded_at__isnull=True,
                quote__expires_at__gt=now,
            )
        )
        .order_by("-created_at")
        .first()
    )
    if earlier is not None:
        raise DomainError(
            ErrorCode.PROBABLE_DUPLICATE_PURCHASE,
            f"This customer already has purchase {earlier.id} for the same items and "
            f"amount (status {earlier.status}). Do not open another purchase: ask the "
            "buyer whether they really want to buy the same items again; only the buyer "
            "can confirm that, on that purchase's status page (the code is e-mailed to "
            "the buyer).",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.BUYER,
            purchase=earlier.id,
            extra={
                "earlier_purchase": {
                    "id": earlier.id,
                    "status": str(earlier.status),
                    "created_at": earlier.created_at.isoformat(),
                },
                "never_twice": window is None,
            },
        )


def purchase_bought_elsewhere(*, purchase_id: str, api_client: ApiClient | None) -> None:
    """Refuse another payment on a purchase whose buyer has since bought the same basket.

    The duplicate guard runs when a purchase opens; a declined purchase does not block a
    new one (the buyer may try again), so the same buyer can open and pay purchase B for
    the same items. A `retry_of` on the declined purchase A afterwards would charge one
    basket twice: any purchase of the same buyer and basket opened after A that holds money
    or is unresolved (by status or on a person's word) refuses it. Takes the buyer's lock
    (the one `purchase_open` takes), so call it inside the caller's atomic() before the
    purchase's row lock (payments/locks.py order)."""
    purchase = (
        Purchase.objects.filter(id=purchase_id)
        .only("id", "api_client_id", "customer_key", "basket_fingerprint", "created_at")
        .first()
    )
    if (
        purchase is None
        or not purchase.customer_key
        or (api_client is not None and purchase.api_client_id not in (None, api_client.id))
    ):
        return  # the caller answers not_found: nothing of another client's is named
    lock_customer(purchase.api_client_id, purchase.customer_key)
    later = (
        Purchase.objects.filter(
            api_client_id=purchase.api_client_id,
            customer_key=purchase.customer_key,
            basket_fingerprint=purchase.basket_fingerprint,
            created_at__gt=purchase.created_at,
        )
        .filter(Q(status__in=_DUPLICATE_OF_STATUSES) | _SETTLED_ON_A_PERSONS_WORD)
        .exclude(id=purchase.id)
        .order_by("-created_at")
        .first()
    )
    if later is not None:
        raise DomainError(
            ErrorCode.PROBABLE_DUPLICATE_PURCHASE,
            f"This buyer has since bought the same items and amount in purchase {later.id} "
            f"(status {later.status}); this purchase will not be charged again. Follow that "
            "purchase instead.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.BUYER,
            purchase=later.id,
            extra={
                "earlier_purchase": {
                    "id": later.id,
                    "status": str(later.status),
                    "created_at": later.created_at.isoformat(),
                }
            },
        )


def purchase_create(
    *,
    api_client: ApiClient | None,
    quote_id: str,
    quote_version: int,
    customer_reference: str,
    customer_email: str = "",
    acknowledge_unresolved: Sequence[str] = (),
    buyer_confirmation: str = "",
    storefront_confirmation: bool = False,
    channel: str = PurchaseChannel.API,
) -> Purchase:
    """purchase_open, for callers that only need the purchase."""
    return purchase_open(
        api_client=api_client,
        quote_id=quote_id,
        quote_version=quote_version,
        customer_reference=customer_reference,
        customer_email=customer_email,
        acknowledge_unresolved=acknowledge_unresolved,
        buyer_confirmation=buyer_confirmation,
        storefront_confirmation=storefront_confirmation,
        channel=channel,
    ).purchase


def buyer_confirmation_issue(*, purchase_id: str) -> str:
    """The buyer's "yes, start a new purchase" on this purchase's status page: a single-use
    code the buyer gives the storefront. Only the hash is stored."""
    code = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(10))
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        BuyerConfirmation.objects.create(
            purchase=purchase,
            code_hash=_code_hash(code),
            expires_at=timezone.now() + timedelta(seconds=settings.BUYER_CONFIRMATION_TTL_SECONDS),
        )
        transition_record(
            purchase_id=purchase.id,
            operation=None,
            field="status",
            source=purchase.status,
            target=purchase.status,
            cause="buyer_confirmed_new_purchase",
            actor="buyer:status_page",
        )
    return f"{code[:5]}-{code[5:]}"


# No 0/O, 1/I/L: the buyer reads it off a page and types it or says it to an agent.
_CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"


def purchase_transition(*, purchase_id: str, name: str, cause: str, actor: str = "") -> Purchase:
    with transaction.atomic():
        purchase = lock_purchase(purchase_id)
        _purchase_to(purchase, name, cause=cause, actor=actor)
    return purchase


def purchase_cancel(
    *,
    purchase_id: str,
    api_client: ApiClient | None = None,
    acting_user: User | None = None,
    reason: str = "",
) -> Purchase:
    """`cancelled` (docs/recovery.md#cancelled-and-expired): by the buyer or support before any
    payment was
    claimed — only failures the provider confirmed may precede it (a person's "failed"
    could still be overturned). Cancelling a cancelled purchase is a no-op."""
    with transaction.atomic():
        purchase = lock_purchase_or_none(purchase_id)
        if purchase is None or (
            api_client is not None and purchase.api_client_id not in (None, api_client.id)
        ):
            raise DomainError(ErrorCode.NOT_FOUND, "No such purchase.", status=404)
        if purchase.status == PurchaseStatus.CANCELLED:
            return purchase
        claimed = purchase.operations.exclude(outcome=Outcome.FAILED, grade=Grade.CONFIRMED)
        if claimed.exists() or purchase.status not in (
            PurchaseStatus.AWAITING_PAYMENT,
            PurchaseStatus.PAYMENT_FAILED,
        ):
            raise DomainError(
                ErrorCode.CANCEL_NOT_ALLOWED,
                f"This purchase is {purchase.status}: a payment was "
                "claimed, so it can no longer be cancelled (ask for a refund or void "
                "instead).",
                status=409,
                retry=RetryAdvice.FORBIDDEN,
                owner=Owner.SUPPORT,
                purchase=purchase.id,
            )
        actor = _actor(api_client, acting_user)
        _purchase_to(
            purchase,
            "mark_cancelled",
            cause="purchase_cancelled",
            actor=actor,
            evidence={"reason": reason} if reason else None,
        )
    return purchase


def purchases_expire_stale() -> int:
    """`expired`: the quote expired before any payment was claimed
    (docs/recovery.md#cancelled-and-expired)."""
    count = 0
    ids = Purchase.objects.filter(
        status=PurchaseStatus.AWAITING_PAYMENT, quote__expires_at__lt=timezone.now()
    ).values_list("id", flat=True)
    for pid in list(ids[:500]):
        with transaction.atomic():
            purchase = lock_purchase(pid)
            if purchase.operations.exists():
                continue
            count += _purchase_to(purchase, "mark_expired", cause="quote_expired")
    return count
