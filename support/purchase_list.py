"""The console's purchases list: every purchase, newest first, filtered by status, created
date, amount and customer, with one search box for what a caller says (a name, an
e-mail, their customer reference, a purchase id, a provider id, an amount).

Read-only. Pagination is by cursor (keyset on `created_at, id`), never OFFSET: page 500
costs what page 1 costs, and a purchase created while someone pages is neither shown
twice nor skipped.

A search may match in several places (a reference prefix, an e-mail prefix, an ACP
buyer's name). Each place is asked separately, each with the filters, the cursor and the
page's limit, and the answers are merged in list order: one OR across them would stop
PostgreSQL from using each place's own index (an OR over a join and a sub-select is a
scan of every purchase at 1 M). The indexes are support migration
0007_console_purchase_list_indexes (bench/scale.py measures the list).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from functools import cache

from django.db.models import F, Func, Q, QuerySet, TextField

from payments.enums import PurchaseStatus
from payments.models import PaymentOperation, Purchase, X402Authorization, X402RefundTransfer
from payments.money import format_money
from recovery.models import LedgerEntry
from support.selectors import search as reference_search

PAGE_SIZE = 50
PAGE_SIZE_MAX = 200
# Below this many characters a text search only matches a whole customer reference:
# shorter prefixes or name fragments match too much to be a search.
SEARCH_MIN = 3
PROVIDER_PREFIXES = ("pi_", "ch_", "re_", "py_")
_TX_HASH = re.compile(r"^0x[0-9a-fA-F]{64}$")
_AMOUNT = re.compile(r"^\d{1,3}(,\d{3})*(\.\d+)?$|^\d+(\.\d+)?$")


class BuyerName(Func):
    """An ACP buyer's names as one upper-case string (`full_name first_name last_name`):
    the checkout session stores the buyer as the agent sent it (acp.models). The same SQL
    is the trigram index's expression (support migration 0006), so a name search is an
    index scan; change both together."""

    template = (
        "UPPER(COALESCE(%(expressions)s->>'full_name', '') || ' ' || "
        "COALESCE(%(expressions)s->>'first_name', '') || ' ' || "
        "COALESCE(%(expressions)s->>'last_name', ''))"
    )
    output_field = TextField()


@dataclass(frozen=True)
class PurchaseFilters:
    q: str = ""
    status: str = ""
    created_from: date | None = None
    created_to: date | None = None  # inclusive (the whole day)
    amount_min: Decimal | None = None  # major units ("12.50")
    amount_max: Decimal | None = None
    customer: str = ""  # a whole customer reference or e-mail
    cursor: str = ""
    per_page: int = PAGE_SIZE


@dataclass(frozen=True)
class PurchaseRow:
    id: str
    customer_email: str
    customer_reference: str
    buyer_name: str
    amount: str  # "12.50 USD"
    status: str  # the status's words
    status_value: str
    channel: str
    created_at: datetime


@dataclass(frozen=True)
class PurchasePage:
    rows: list[PurchaseRow]
    next_cursor: str
    matched_as: list[str] = field(default_factory=list)  # what the search was taken for
    errors: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ parsing the form


def _major(text: str) -> Decimal | None:
    text = (text or "").strip().replace(" ", "")
    if not text:
        return None
    if not _AMOUNT.match(text):
        raise ValueError(text)
    return Decimal(text.replace(",", ""))


def _day(text: str) -> date | None:
    text = (text or "").strip()
    return date.fromisoformat(text) if text else None


def filters_from_query(params) -> tuple[PurchaseFilters, list[str]]:
    """A GET query (the list's form) -> filters, and what could not be read, in words."""
    errors: list[str] = []
    status = (params.get("status") or "").strip()
    if status and status not in PurchaseStatus.values:
        errors.append(f"“{status}” is not a purchase status.")
        status = ""
    days: dict[str, date | None] = {}
    for name, words in (("created_from", "From"), ("created_to", "To")):
        try:
            days[name] = _day(params.get(name, ""))
        except ValueError:
            errors.append(f"{words}: a date reads like 2026-12-05.")
            days[name] = None
    amounts: dict[str, Decimal | None] = {}
    for name, words in (("amount_min", "Amount from"), ("amount_max", "Amount to")):
        try:
            amounts[name] = _major(params.get(name, ""))
        except (ValueError, InvalidOperation):
            errors.append(f"{words}: an amount reads like 12.50.")
            amounts[name] = None
    try:
        per_page = max(1, min(PAGE_SIZE_MAX, int(params.get("per_page") or PAGE_SIZE)))
    except ValueError:
        per_page = PAGE_SIZE
    return PurchaseFilters(
        q=(params.get("q") or "").strip(),
        status=status,
        customer=(params.get("customer") or "").strip(),
        cursor=params.get("cursor", ""),
        per_page=per_page,
        created_from=days["created_from"],
        created_to=days["created_to"],
        amount_min=amounts["amount_min"],
        amount_max=amounts["amount_max"],
    ), errors


# -------------------------------------------------------------------------- amounts


@cache
def _currencies_by_exponent() -> dict[int, tuple[str, ...]]:
    """Lower-case ISO codes (as stored) of the currencies whose minor unit is not a
    hundredth: {0: ("jpy", …), 3: ("kwd", …)}; every other currency has 2 decimals."""
    from babel.numbers import get_currency_precision, list_currencies

    out: dict[int, list[str]] = {}
    for code in list_currencies():
        exp = get_currency_precision(code)
        if exp != 2:
            out.setdefault(exp, []).append(code.lower())
    return {exp: tuple(sorted(codes)) for exp, codes in out.items()}


def amount_q(value: Decimal, lookup: str = "exact") -> Q:
    """Purchases whose amount, read in their own currency's major units, is `value`
    (`lookup` "exact", "gte" or "lte"): "12.50" is 1 250 minor units in USD, 12 500 in
    KWD, and no JPY amount at all."""
    others = _currencies_by_exponent()
    q = Q()
    for exp, codes in [*others.items(), (2, None)]:
        minor = value.scaleb(exp)
        if lookup == "exact" and minor != minor.to_integral_value():
            continue  # 12.50 is no amount of a currency without cents
        if lookup == "gte":
            minor = minor.to_integral_value(rounding="ROUND_CEILING")
        elif lookup == "lte":
            minor = minor.to_integral_value(rounding="ROUND_FLOOR")
        where = (
            Q(currency__in=codes)
            if codes is not None
            else ~Q(currency__in=[c for cs in others.values() for c in cs])
        )
        q |= where & Q(**{f"amount__{lookup}": int(minor)})
    return q or Q(pk__in=[])


# ------------------------------------------------------------------------- the search


def _provider_reference_ids(ref: str) -> set[str]:
    ids = set(
        PaymentOperation.objects.filter(
            Q(provider_reference=ref) | Q(provider_charge=ref)
        ).values_list("purchase_id", flat=True)
    )
    ids |= set(
        LedgerEntry.objects.filter(provider_reference=ref).values_list("purchase_id", flat=True)
    )
    return ids


def _tx_hash_ids(tx: str) -> set[str]:
    hashes = {tx, tx.lower()}
    ops = set(
        X402Authorization.objects.filter(transaction_hash__in=hashes).values_list(
            "operation_id", flat=True
        )
    )
    ops |= set(
        X402RefundTransfer.objects.filter(transaction_hash__in=hashes).values_list(
            "operation_id", flat=True
        )
    )
    return set(PaymentOperation.objects.filter(pk__in=ops).values_list("purchase_id", flat=True))


def _other_reference_ids(q: str) -> set[str]:
    # Operation ids, order references, balance transactions, provider keys, events: the
    # header search (support.selectors.search) knows each of them.
    return {p.pk for p in reference_search(q).purchases}


def search_branches(q: str) -> list[tuple[str, Q]]:
    """What a typed search can be, each as (words, condition on Purchase). Several
    branches are merged by the list (see the module docstring)."""
    q = q.strip()
    if not q:
        return []
    if q.startswith("pur_"):
        return [("purchase id", Q(pk=q))]
    if q.startswith(PROVIDER_PREFIXES):
        return [("provider id", Q(pk__in=_provider_reference_ids(q)))]
    if _TX_HASH.match(q):
        return [("x402 transaction", Q(pk__in=_tx_hash_ids(q)))]
    if q.startswith(("op_", "txn_", "vk_", "evt_")) or q.lower().startswith("ord_"):
        return [("reference", Q(pk__in=_other_reference_ids(q)))]
    branches = [("customer reference", Q(customer_reference=q))]
    try:
        amount = _major(q.removesuffix(" USD").removesuffix(" usd"))
    except (ValueError, InvalidOperation):
        amount = None
    if amount is not None:
        branches.append(("amount", amount_q(amount)))
        return branches
    if "@" in q:
        return [("e-mail", Q(customer_email__istartswith=q))]
    if len(q) < SEARCH_MIN:
        return branches
    # Driven from the sessions' trigram index, then each session's purchase by key (the
    # join is inner: `acp_session__isnull=False`). support may not import acp (layers), so
    # the session is read through the purchase's reverse relation.
    names = (
        Purchase.objects.alias(buyer_name=BuyerName(F("acp_session__buyer")))
        .filter(acp_session__isnull=False, buyer_name__contains=q.upper())
        .values("pk")
    )
    return [
        ("customer reference", Q(customer_reference__startswith=q)),
        ("e-mail", Q(customer_email__istartswith=q)),
        ("buyer name", Q(pk__in=names)),
    ]


# ------------------------------------------------------------------------ the cursor


def cursor_encode(created_at: datetime, pk: str) -> str:
    raw = f"{created_at.astimezone(UTC).isoformat()}|{pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_decode(cursor: str) -> tuple[datetime, str] | None:
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, pk = raw.split("|", 1)
        return datetime.fromisoformat(at), pk
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None


def _after(cursor: tuple[datetime, str]) -> Q:
    at, pk = cursor
    # (created_at, id) < (at, pk), written so that `created_at <= at` is an index bound.
    return Q(created_at__lte=at) & (Q(created_at__lt=at) | Q(pk__lt=pk))


# -------------------------------------------------------------------------- the list


def _filtered(f: PurchaseFilters) -> QuerySet:
    qs = Purchase.objects.all()
    if f.status:
        qs = qs.filter(status=f.status)
    if f.created_from:
        qs = qs.filter(created_at__gte=datetime.combine(f.created_from, time.min, tzinfo=UTC))
    if f.created_to:
        qs = qs.filter(
            created_at__lt=datetime.combine(f.created_to + timedelta(days=1), time.min, tzinfo=UTC)
        )
    if f.amount_min is not None:
        qs = qs.filter(amount_q(f.amount_min, "gte"))
    if f.amount_max is not None:
        qs = qs.filter(amount_q(f.amount_max, "lte"))
    if f.customer:
        qs = qs.filter(Q(customer_reference=f.customer) | Q(customer_email__iexact=f.customer))
    return qs


_ROW_FIELDS = (
    "id",
    "created_at",
    "customer_email",
    "customer_reference",
    "amount",
    "currency",
    "status",
    "channel",
)


def buyer_names(ids: list[str]) -> dict[str, str]:
    """The name an ACP buyer gave, per purchase id (only purchases that have one)."""
    out = {}
    for pid, buyer in Purchase.objects.filter(pk__in=ids, acp_session__isnull=False).values_list(
        "pk", "acp_session__buyer"
    ):
        buyer = buyer if isinstance(buyer, dict) else {}
        name = (
            buyer.get("full_name")
            or " ".join(str(buyer.get(k) or "") for k in ("first_name", "last_name")).strip()
        )
        if name:
            out[pid] = str(name)
    return out


def purchase_list(f: PurchaseFilters) -> PurchasePage:
    """One page of purchases, newest first, and the cursor of the next page ("" at the
    end)."""
    base = _filtered(f)
    cursor = cursor_decode(f.cursor)
    if cursor is not None:
        base = base.filter(_after(cursor))
    branches = search_branches(f.q) if f.q else [("", Q())]
    limit = f.per_page + 1
    found: dict[str, dict] = {}
    matched: list[str] = []
    for words, condition in branches:
        rows = list(
            base.filter(condition).order_by("-created_at", "-id").values(*_ROW_FIELDS)[:limit]
        )
        if rows and words and words not in matched:
            matched.append(words)
        for row in rows:
            found.setdefault(row["id"], row)
    ordered = sorted(found.values(), key=lambda r: (r["created_at"], r["id"]), reverse=True)
    page, more = ordered[: f.per_page], len(ordered) > f.per_page
    names = buyer_names([r["id"] for r in page])
    labels = dict(PurchaseStatus.choices)
    channels = dict(Purchase._meta.get_field("channel").choices or ())
    return PurchasePage(
        rows=[
            PurchaseRow(
                id=r["id"],
                customer_email=r["customer_email"],
                customer_reference=r["customer_reference"],
                buyer_name=names.get(r["id"], ""),
                amount=format_money(r["amount"], r["currency"]),
                status=str(labels.get(r["status"], r["status"])),
                status_value=r["status"],
                channel=str(channels.get(r["channel"], r["channel"])),
                created_at=r["created_at"],
            )
            for r in page
        ],
        next_cursor=cursor_encode(page[-1]["created_at"], page[-1]["id"]) if more else "",
        matched_as=matched,
    )
