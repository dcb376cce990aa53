"""Downstream step handlers and their policies.

Every handler first checks whether its effect already exists and returns if so; effects
are rows inserted with INSERT ... ON CONFLICT DO NOTHING against a unique constraint, so
a redelivered or concurrent run cannot create a second one even without the StepRun lock
the orchestrator holds around it.

Handlers raise:
  StepRejected  — a definitive refusal (out of stock): retrying will not help, the step's
                  policy decides at once (compensate or manual review);
  any other     — transient (database hiccup, mail server down): retried with backoff up
                  to the policy's bound, then the policy decides.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from payments.enums import OperationKind
from payments.models import Product

from .models import (
    STEP_ORDER,
    CrmUpdate,
    InventoryCommit,
    LedgerAccount,
    LedgerEntry,
    Order,
    StepName,
    StepRun,
)


class StepRejected(Exception):
    """The step cannot succeed as things stand; do not retry, apply the policy."""


class Policy:
    """What happens when a step cannot complete (docs/recovery.md#step-policy)."""

    COMPENSATE = "compensate"  # after bounded retries: void before capture, refund after
    MANUAL = "manual"  # after bounded retries: the purchase goes to manual review
    RETRY = "retry"  # keep retrying (bounded by STEP_RETRY_LIMIT, then manual)
    AT_MOST_ONCE = "at_most_once"  # never resent without review once a send may have happened
    ALL = (COMPENSATE, MANUAL, RETRY, AT_MOST_ONCE)


DEFAULT_POLICY: dict[str, str] = {
    StepName.ORDER: Policy.COMPENSATE,
    StepName.INVENTORY: Policy.COMPENSATE,
    StepName.LEDGER: Policy.COMPENSATE,
    StepName.CONFIRMATION: Policy.AT_MOST_ONCE,
    StepName.CRM: Policy.RETRY,
    StepName.DELIVERABLE: Policy.RETRY,
}

# Which overrides a product may set per step (confirmation stays at-most-once).
_ALLOWED_OVERRIDES: dict[str, tuple[str, ...]] = {
    StepName.ORDER: (Policy.COMPENSATE, Policy.MANUAL),
    StepName.INVENTORY: (Policy.COMPENSATE, Policy.MANUAL),
    StepName.LEDGER: (Policy.COMPENSATE, Policy.MANUAL),
    StepName.CRM: (Policy.RETRY, Policy.MANUAL),
    StepName.DELIVERABLE: (Policy.RETRY, Policy.MANUAL, Policy.COMPENSATE),
}
# When several products of one purchase disagree, the most careful policy wins.
_STRICTNESS: dict[str, int] = {
    Policy.MANUAL: 3,
    Policy.AT_MOST_ONCE: 2,
    Policy.COMPENSATE: 1,
    Policy.RETRY: 0,
}


@dataclass(frozen=True)
class PaymentInfo:
    id: str
    kind: str
    amount: int
    currency: str
    provider_reference: str
    provider_charge: str


@dataclass
class PurchaseContext:
    purchase_id: str
    customer_reference: str
    customer_email: str
    amount: int
    currency: str
    items: list[dict[str, Any]]
    payment: PaymentInfo
    product_kinds: dict[str, str] = field(default_factory=dict)
    product_policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    captured: PaymentInfo | None = None  # the capture op, for authorize-then-capture

    @property
    def digital(self) -> bool:
        return any(kind == "digital" for kind in self.product_kinds.values())

    @property
    def steps(self) -> list[str]:
        steps = [s.value for s in STEP_ORDER]
        if self.digital:
            # The deliverable comes before the e-mail so the e-mail can point to it.
            steps.insert(steps.index(StepName.CONFIRMATION), StepName.DELIVERABLE.value)
        return steps

    def policy(self, step: str) -> str:
        allowed = _ALLOWED_OVERRIDES.get(step, ())
        chosen: list[str] = []
        for overrides in self.product_policies.values():
            value = (overrides or {}).get(step)
            if isinstance(value, dict):
                value = value.get("policy")
            if value in allowed:
                chosen.append(value)
        if not chosen:
            return DEFAULT_POLICY[step]
        return max(chosen, key=_STRICTNESS.__getitem__)

    def max_attempts(self, step: str) -> int:
        for overrides in self.product_policies.values():
            value = (overrides or {}).get(step)
            if isinstance(value, dict) and isinstance(value.get("max_attempts"), int):
                attempts: int = value["max_attempts"]
                return max(1, attempts)
        limit: int = (
            settings.STEP_RETRY_LIMIT
            if self.policy(step) == Policy.RETRY
            else settings.STEP_MAX_ATTEMPTS
        )
        return limit


def step_key(purchase_id: str, step: str) -> str:
    return f"{purchase_id}:{step}"


# -- handlers: run inside the orchestrator's transaction holding the StepRun lock ------


def run_order(ctx: PurchaseContext, run: StepRun) -> dict[str, Any]:
    existing = Order.objects.filter(purchase_id=ctx.purchase_id).first()
    if existing is None:
        reference = f"ord_{secrets.token_hex(8)}"
        Order.objects.bulk_create(
            [Order(purchase_id=ctx.purchase_id, reference=reference)], ignore_conflicts=True
        )
        existing = Order.objects.get(purchase_id=ctx.purchase_id)
    return {"order": existing.reference}


def run_inventory(ctx: PurchaseContext, run: StepRun) -> dict[str, Any]:
    done = set(
        InventoryCommit.objects.filter(purchase_id=ctx.purchase_id).values_list("sku", flat=True)
    )
    # One commit per SKU, so lines of one SKU are summed (quotes merge them; an older quote
    # with duplicate lines must not decrement twice and record once).
    quantities: dict[str, int] = {}
    for item in ctx.items:
        quantities[item["sku"]] = quantities.get(item["sku"], 0) + int(item.get("quantity", 1))
    for sku, quantity in quantities.items():
        if sku in done:
            continue
        if ctx.product_kinds.get(sku) != "digital":
            # Conditional decrement: F() in the UPDATE, never read-then-write; 0 rows
            # means not enough stock (a definitive refusal, not worth retrying).
            updated = Product.objects.filter(sku=sku, stock__gte=quantity).update(
                stock=F("stock") - quantity
            )
            if not updated:
                raise StepRejected(f"insufficient stock for {sku}")
        InventoryCommit.objects.bulk_create(
            [InventoryCommit(purchase_id=ctx.purchase_id, sku=sku, quantity=quantity)],
            ignore_conflicts=True,
        )
    return {"skus": sorted({i["sku"] for i in ctx.items})}


def _ledger_pair(
    *,
    purchase_id: str,
    operation_id: str,
    provider_reference: str,
    entry_type: str,
    debit: str,
    credit: str,
    amount: int,
    currency: str,
) -> None:
    # Double entry: the two rows of one movement sum to zero.
    LedgerEntry.objects.bulk_create(
        [
            LedgerEntry(
                purchase_id=purchase_id,
                operation_id=operation_id,
                provider_reference=provider_reference,
                entry_type=entry_type,
                account=debit,
                amount=amount,
                currency=currency,
            ),
            LedgerEntry(
                purchase_id=purchase_id,
                operation_id=operation_id,
                provider_reference=provider_reference,
                entry_type=entry_type,
                account=credit,
                amount=-amount,
                currency=currency,
            ),
        ],
        ignore_conflicts=True,
    )


def ledger_record_sale(*, purchase_id: str, payment: PaymentInfo) -> None:
    """Money the provider holds for us: the charge (or the capture of an authorization)."""
    _ledger_pair(
        purchase_id=purchase_id,
        operation_id=payment.id,
        provider_reference=payment.provider_charge or payment.provider_reference,
        entry_type="sale",
        debit=LedgerAccount.PROVIDER_BALANCE,
        credit=LedgerAccount.REVENUE
        if payment.kind != OperationKind.CAPTURE
        else LedgerAccount.AUTHORIZED,
        amount=payment.amount,
        currency=payment.currency,
    )


def ledger_record_authorization(*, purchase_id: str, payment: PaymentInfo) -> None:
    _ledger_pair(
        purchase_id=purchase_id,
        operation_id=payment.id,
        provider_reference=payment.provider_reference,
        entry_type="authorization",
        debit=LedgerAccount.AUTHORIZED,
        credit=LedgerAccount.REVENUE,
        amount=payment.amount,
        currency=payment.currency,
    )


def ledger_record_refund(*, purchase_id: str, refund: PaymentInfo) -> None:
    _ledger_pair(
        purchase_id=purchase_id,
        operation_id=refund.id,
        provider_reference=refund.provider_reference,
        entry_type="refund",
        debit=LedgerAccount.REVENUE,
        credit=LedgerAccount.PROVIDER_BALANCE,
        amount=refund.amount,
        currency=refund.currency,
    )


def ledger_record_void(*, purchase_id: str, void: PaymentInfo, amount: int) -> None:
    _ledger_pair(
        purchase_id=purchase_id,
        operation_id=void.id,
        provider_reference=void.provider_reference,
        entry_type="void",
        debit=LedgerAccount.REVENUE,
        credit=LedgerAccount.AUTHORIZED,
        amount=amount,
        currency=void.currency,
    )


# What an operation books under its own id, so what an overturn of it takes back.
UNMADE_REVERSIBLE = ("sale", "authorization", "refund", "void")


def ledger_reverse_unmade(*, purchase_id: str, operation_id: str) -> int:
    """The provider's record overturned a person's "succeeded": what the ledger booked for
    that operation on their word (the sale, the authorization, the refund or the void) is
    reversed, row by row, so the ledger follows the provider (a refund that never happened
    no longer books money back, so the room it freed is not booked twice). Idempotent (one
    reversal per booked row); an operation that booked nothing reverses nothing."""
    booked = list(
        LedgerEntry.objects.filter(operation_id=operation_id, entry_type__in=UNMADE_REVERSIBLE)
    )
    LedgerEntry.objects.bulk_create(
        [
            LedgerEntry(
                purchase_id=purchase_id,
                operation_id=operation_id,
                provider_reference=row.provider_reference,
                entry_type=f"{row.entry_type}_reversal",
                account=row.account,
                amount=-row.amount,
                currency=row.currency,
            )
            for row in booked
        ],
        ignore_conflicts=True,
    )
    return len(booked)


def run_ledger(ctx: PurchaseContext, run: StepRun) -> dict[str, Any]:
    if ctx.payment.kind == OperationKind.AUTHORIZE:
        # Not captured yet: the provider holds nothing; the sale is booked at capture.
        ledger_record_authorization(purchase_id=ctx.purchase_id, payment=ctx.payment)
        if ctx.captured is not None:
            ledger_record_sale(purchase_id=ctx.purchase_id, payment=ctx.captured)
    else:
        ledger_record_sale(purchase_id=ctx.purchase_id, payment=ctx.payment)
    return {"operation": ctx.payment.id, "amount": ctx.payment.amount}


def run_crm(ctx: PurchaseContext, run: StepRun) -> dict[str, Any]:
    CrmUpdate.objects.bulk_create(
        [CrmUpdate(purchase_id=ctx.purchase_id, customer_reference=ctx.customer_reference)],
        ignore_conflicts=True,
    )
    return {"customer_reference": ctx.customer_reference}


def deliverable_job_reference(run: StepRun) -> str:
    return f"job_{hashlib.sha256(run.key.encode()).hexdigest()[:20]}"


def deliverable_execute(ctx: PurchaseContext, job_reference: str) -> dict[str, Any]:
    """The 'external job': a licence derived from the job reference, so running it again
    for the same reference yields the same result (what an external system keyed by our
    reference would do)."""
    digest = hmac.new(
        settings.SECRET_KEY.encode(), job_reference.encode(), hashlib.sha256
    ).hexdigest()
    return {
        "licence_key": "-".join(digest[i : i + 5].upper() for i in range(0, 25, 5)),
        "download_path": f"/api/v1/purchases/{ctx.purchase_id}/deliverable",
        "skus": sorted(s for s, k in ctx.product_kinds.items() if k == "digital"),
    }


def deliverable_expiry() -> datetime:
    return timezone.now() + timedelta(days=settings.DELIVERABLE_RETENTION_DAYS)


DB_STEPS: dict[str, Callable[[PurchaseContext, StepRun], dict[str, Any]]] = {
    StepName.ORDER: run_order,
    StepName.INVENTORY: run_inventory,
    StepName.LEDGER: run_ledger,
    StepName.CRM: run_crm,
}
