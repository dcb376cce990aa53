"""Settlement comparison: the provider's balance transactions against the ledger.

Reads only at the provider (through the adapter). Each mismatch becomes one open
SettlementDiscrepancy row for finance (unique per reference and kind while open):
  missing_locally      the provider moved money the ledger does not know about;
  missing_at_provider  the ledger books money the provider does not show;
  amount_differs       both know it, amounts (or currencies) differ.
A discrepancy that no longer differs on a later run is marked resolved.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from payments.enums import Rail
from payments.models import Dispute, PaymentOperation
from payments.money import format_money
from payments.providers.base import payment_provider
from payments.services import provider_for_rail

from .models import LedgerAccount, LedgerEntry, SettlementDiscrepancy

log = logging.getLogger(__name__)


class Kind:
    MISSING_LOCALLY = "missing_locally"
    MISSING_AT_PROVIDER = "missing_at_provider"
    AMOUNT_DIFFERS = "amount_differs"


@dataclass
class ComparisonResult:
    provider_transactions: int
    ledger_references: int
    discrepancies: int
    resolved: int


# Dispute withdrawals/reinstatements are `adjustment` balance transactions whose source is
# the dispute; their fee (the dispute fee) is booked in the ledger, so they compare net.
_DISPUTE_CATEGORIES = ("dispute", "dispute_reversal")
# A reversal (recovery.steps.ledger_reverse_unmade: the provider overturned a person's
# word) nets its booking to nothing, so a movement the provider never made is not missing.
LEDGER_ENTRY_TYPES = (
    "sale",
    "refund",
    "dispute_withdrawal",
    "dispute_fee",
    "dispute_reinstatement",
    "sale_reversal",
    "refund_reversal",
)


def _provider_totals(transactions: list[dict[str, Any]]) -> dict[str, tuple[int, str]]:
    totals: dict[str, list[Any]] = defaultdict(lambda: [0, ""])
    for txn in transactions:
        source = txn.get("source") or ""
        is_dispute = (
            txn.get("type") == "adjustment" and txn.get("reporting_category") in _DISPUTE_CATEGORIES
        )
        if not source or not (
            is_dispute or txn.get("type") in ("charge", "refund", "payment", "payment_refund")
        ):
            continue
        amount = int(txn.get("amount") or 0)
        if is_dispute:
            amount -= int(txn.get("fee") or 0)
        totals[source][0] += amount
        totals[source][1] = (txn.get("currency") or "").lower()
    return {k: (v[0], v[1]) for k, v in totals.items()}


def _ledger_totals(since: datetime) -> dict[str, tuple[int, str]]:
    totals: dict[str, list[Any]] = defaultdict(lambda: [0, ""])
    rows = (
        LedgerEntry.objects.filter(
            account=LedgerAccount.PROVIDER_BALANCE,
            entry_type__in=LEDGER_ENTRY_TYPES,
            created_at__gte=since,
        )
        .exclude(provider_reference="")
        .values_list("provider_reference", "amount", "currency")
    )
    for reference, amount, currency in rows:
        totals[reference][0] += amount
        totals[reference][1] = currency.lower()
    return {k: (v[0], v[1]) for k, v in totals.items()}


def _recently_settled_references(references: set[str], cutoff: datetime) -> set[str]:
    """Provider references of operations settled after `cutoff`: the ledger step may not
    have run yet, so their absence from the ledger is not (yet) a discrepancy."""

    if not references:
        return set()
    rows = (
        PaymentOperation.objects.filter(
            Q(provider_charge__in=references) | Q(provider_reference__in=references)
        )
        .filter(Q(settled_at__gte=cutoff) | Q(settled_at__isnull=True))
        .values_list("provider_charge", "provider_reference")
    )
    out: set[str] = set()
    for charge, reference in rows:
        out.update(x for x in (charge, reference) if x in references)

    out.update(
        Dispute.objects.filter(id__in=references, updated_at__gte=cutoff).values_list(
            "id", flat=True
        )
    )
    return out


def settlement_compare(*, grace_seconds: float | None = None) -> ComparisonResult:
    if grace_seconds is None:
        grace_seconds = settings.SETTLEMENT_GRACE_SECONDS
    provider = payment_provider(provider_for_rail(Rail.STRIPE))
    # Network I/O first, outside any transaction.
    transactions = provider.list_balance_transactions(limit=settings.SETTLEMENT_MAX_TRANSACTIONS)
    truncated = len(transactions) >= settings.SETTLEMENT_MAX_TRANSACTIONS
    now = timezone.now()
    grace_cutoff = now - timedelta(seconds=grace_seconds)
    provider_totals = _provider_totals(transactions)
    ledger_totals = _ledger_totals(now - timedelta(hours=settings.SETTLEMENT_WINDOW_HOURS))
    young_ledger = set(
        LedgerEntry.objects.filter(
            account=LedgerAccount.PROVIDER_BALANCE,
            created_at__gt=grace_cutoff,
            provider_reference__in=list(ledger_totals),
        ).values_list("provider_reference", flat=True)
    )
    unknown_locally = set(provider_totals) - set(ledger_totals)
    young_provider = _recently_settled_references(unknown_locally, grace_cutoff)

    found: list[SettlementDiscrepancy] = []
    matched: set[str] = set()
    for reference, (amount, currency) in provider_totals.items():
        if reference not in ledger_totals:
            if reference not in young_provider:
                found.append(
                    SettlementDiscrepancy(
                        provider_reference=reference,
                        kind=Kind.MISSING_LOCALLY,
                        provider_amount=amount,
                        ledger_amount=None,
                        currency=currency,
                        detail="the provider shows this movement; the ledger has no entry",
                    )
                )
            continue
        ledger_amount, ledger_currency = ledger_totals[reference]
        if ledger_amount != amount or (ledger_currency and ledger_currency != currency):
            found.append(
                SettlementDiscrepancy(
                    provider_reference=reference,
                    kind=Kind.AMOUNT_DIFFERS,
                    provider_amount=amount,
                    ledger_amount=ledger_amount,
                    currency=currency,
                    detail=f"provider {format_money(amount, currency)}, ledger "
                    f"{format_money(ledger_amount, ledger_currency or currency)}",
                )
            )
        else:
            matched.add(reference)
    if not truncated:  # a truncated provider list cannot prove absence
        for reference, (ledger_amount, currency) in ledger_totals.items():
            if reference in provider_totals or reference in young_ledger or ledger_amount == 0:
                continue
            found.append(
                SettlementDiscrepancy(
                    provider_reference=reference,
                    kind=Kind.MISSING_AT_PROVIDER,
                    provider_amount=None,
                    ledger_amount=ledger_amount,
                    currency=currency,
                    detail="the ledger books this movement; the provider shows none",
                )
            )

    with transaction.atomic():
        # One open row per (reference, kind): a repeated finding writes nothing.
        SettlementDiscrepancy.objects.bulk_create(found, ignore_conflicts=True)
        resolved = SettlementDiscrepancy.objects.filter(
            resolved_at__isnull=True, provider_reference__in=matched
        ).update(resolved_at=now)
    if found:
        log.warning("settlement comparison: %d discrepancies", len(found))
    return ComparisonResult(
        provider_transactions=len(transactions),
        ledger_references=len(ledger_totals),
        discrepancies=len(found),
        resolved=resolved,
    )
