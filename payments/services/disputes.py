"""Dispute services (writes): a provider dispute on one of Verity's payments.

A dispute is created and moved only by verified evidence: a matched
webhook (`charge.dispute.*`, verification `webhook`) or a read-back of the provider's
Dispute (verification `provider`). The lifecycle only moves forward
(`DISPUTE_STATUS_RANK`): events arrive out of order and a late one never regresses the
record. Every change writes a `DISPUTE_CHANGED` outbox row in the same transaction; its
handler (recovery) books the ledger entries and reads the dispute back.

Lock order: Purchase -> PaymentOperation -> Dispute (payments.locks).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.models import OutboxCategory, StepRun, StepState
from recovery.outbox import outbox_put

from ..enums import (
    DISPUTE_CLOSED_STATUSES,
    DISPUTE_STATUS_RANK,
    PAYMENT_KINDS,
    CallPurpose,
    CallStep,
    DisputeStatus,
    Outcome,
    PurchaseStatus,
    Verification,
)
from ..locks import (
    assert_outside_transaction,
    lock_dispute,
    lock_purchase_and_operation,
)
from ..models import Dispute, PaymentOperation, ProviderCall, Purchase
from ..providers.base import DisputeObject, payment_provider
from ..selectors import PurchaseMoney, purchase_money
from .common import _purchase_to, payment_unsettled, provider_for, transition_record
from .observations import duplicate_compensate_locked

log = logging.getLogger("verity.payments.disputes")


class DisputeApply(str, Enum):
    APPLIED = "applied"
    NO_CHANGE = "no_change"
    STALE = "stale"
    CONFLICT = "conflict"
    MISMATCH = "mismatch"
    NO_MATCH = "no_match"
    WAITING = "waiting"  # the payment it names is not settled at Verity yet


@dataclass(frozen=True)
class DisputeApplyResult:
    result: DisputeApply
    reason: str = ""
    dispute_id: str = ""
    operation_id: str = ""
    purchase_id: str = ""


def dispute_payment_for(obj: DisputeObject) -> PaymentOperation | None:
    """The charge/authorize operation a dispute names: through its PaymentIntent, else its
    charge. Read only; the apply re-checks under the lock."""
    ops = PaymentOperation.objects.select_related("purchase").filter(kind__in=PAYMENT_KINDS)
    op = None
    if obj.payment_intent:
        op = ops.filter(provider_reference=obj.payment_intent).order_by("-created_at").first()
    if op is None and obj.charge:
        op = ops.filter(provider_charge=obj.charge).order_by("-created_at").first()
    return op


def _mismatch(payment: PaymentOperation, obj: DisputeObject) -> str:
    expected_account = payment.provider_account or getattr(settings, "STRIPE_ACCOUNT", "") or ""
    if (obj.account or "") != expected_account:
        return "account"
    if obj.payment_intent and obj.payment_intent != payment.provider_reference:
        return "reference"
    if obj.charge and payment.provider_charge and obj.charge != payment.provider_charge:
        return "charge"
    if payment.outcome != Outcome.SUCCEEDED:
        return "payment_not_succeeded"
    if obj.currency.lower() != payment.currency.lower():
        return "currency"
    if obj.amount <= 0 or obj.amount > payment.amount:
        return "amount"
    if obj.status not in DisputeStatus.values:
        return "status"
    return ""


def _merge_moves(stored: list[dict[str, Any]], obj: DisputeObject) -> list[dict[str, Any]]:
    """Union of balance transactions by id: what the provider once reported stays booked."""
    by_id = {m["id"]: m for m in stored if m.get("id")}
    for move in obj.balance_transactions:
        if move.id and move.id not in by_id:
            by_id[move.id] = move.as_dict()
    return sorted(by_id.values(), key=lambda m: m["id"])


def _due(obj: DisputeObject) -> datetime | None:
    return datetime.fromtimestamp(obj.evidence_due_by, tz=UTC) if obj.evidence_due_by else None


def _purchase_status(
    purchase: Purchase,
    name: str,
    *,
    cause: str,
    actor: str,
    evidence: dict[str, Any],
    arg: str | None = None,
) -> bool:
    args = (arg,) if arg is not None else ()
    return _purchase_to(purchase, name, *args, cause=cause, actor=actor, evidence=evidence)


def _follow_purchase(purchase: Purchase, dispute: Dispute, *, cause: str, actor: str) -> None:
    """A disputed purchase says so until the dispute closes, then how it ended
    (docs/reliability.md#rules-every-money-movement-obeys).
    A dispute of a DUPLICATE charge is about money the purchase never kept (its own
    compensation returns what is left of it): the purchase's status, its order and what
    the customer is told follow the purchase's own payment only.

    What a closed dispute leaves is decided on the money (goods follow the money), never on
    the status the purchase had when it opened: money that went back meanwhile (a full
    refund while an inquiry was open, a refunded charge disputed and won) stays back, and a
    refund still in flight keeps the purchase `refund_pending`."""
    evidence = {"dispute": dispute.id, "status": dispute.status}
    if dispute.payment.is_duplicate:
        return
    if dispute.status not in DISPUTE_CLOSED_STATUSES:
        _purchase_status(purchase, "mark_disputed", cause=cause, actor=actor, evidence=evidence)
        return
    other_open = (
        Dispute.objects.filter(purchase_id=purchase.id, payment__is_duplicate=False)
        .exclude(id=dispute.id)
        .exclude(status__in=DISPUTE_CLOSED_STATUSES)
        .exists()
    )
    if other_open:
        return
    money = purchase_money(purchase.id)
    name, arg = _closed_status(purchase, dispute, money)
    if purchase.status != PurchaseStatus.DISPUTED:
        if name == "mark_refunded" and purchase.status == PurchaseStatus.REFUNDED:
            return  # refunded while the inquiry was open: the closure changes nothing
        # First evidence of this dispute is already its closure: record that it was open.
        if not _purchase_status(
            purchase, "mark_disputed", cause=cause, actor=actor, evidence=evidence
        ):
            return
    _purchase_status(purchase, name, cause=cause, actor=actor, evidence=evidence, arg=arg)


# The statuses an inquiry's closure may restore as they were: a paid purchase, fulfilled
# or not. Anything else recorded before (a refund in flight, refunded, a dispute's end) is
# decided again from the money.
_RESTORABLE = (
    PurchaseStatus.PAID,
    PurchaseStatus.FULFILLING,
    PurchaseStatus.COMPLETED,
    PurchaseStatus.MANUAL_REVIEW,
)


def _closed_status(
    purchase: Purchase, dispute: Dispute, money: PurchaseMoney
) -> tuple[str, str | None]:
    """The transition (and its argument) a closed dispute takes the purchase through."""
    if dispute.status == DisputeStatus.LOST or money.dispute_lost:
        # This dispute, or an earlier one of the same payment, gave the money back.
        return "mark_dispute_lost", None
    if money.returned or dispute.status == DisputeStatus.CHARGE_REFUNDED:
        # The buyer has the money back (the provider's `charge_refunded` says so before
        # Verity may have heard of the refund): nothing to restore.
        return "mark_refunded", None
    if dispute.status == DisputeStatus.WON:
        return "mark_dispute_won", None
    # warning_closed: an inquiry that never became a dispute; the purchase is paid for
    # what it kept.
    if money.refund_awaiting_provider:
        return "mark_dispute_withdrawn", PurchaseStatus.REFUND_PENDING
    before = dispute.purchase_status_before
    if before in _RESTORABLE:
        return "mark_dispute_withdrawn", before
    finished = StepRun.objects.filter(purchase_id=purchase.id).exists() and not (
        StepRun.objects.filter(purchase_id=purchase.id)
        .exclude(state__in=[StepState.DONE, StepState.COMPENSATED])
        .exists()
    )
    return ("mark_dispute_withdrawn", PurchaseStatus.COMPLETED if finished else PurchaseStatus.PAID)


def _totals(moves: list[dict[str, Any]]) -> tuple[int, int, int]:
    withdrawn = -sum(m["amount"] for m in moves if m["amount"] < 0)
    reinstated = sum(m["amount"] for m in moves if m["amount"] > 0)
    fees = sum(m["fee"] for m in moves)
    return withdrawn, reinstated, fees


def dispute_apply_observation(
    *, obj: DisputeObject, verification: str, cause: str, actor: str = ""
) -> DisputeApplyResult:
    """THE one place provider evidence about a dispute changes Verity's record."""
    payment = dispute_payment_for(obj)
    if payment is None:
        return DisputeApplyResult(DisputeApply.NO_MATCH, "no_matching_payment", obj.id)
    with transaction.atomic():
        purchase, payment = lock_purchase_and_operation(payment.id)
        ids = {"dispute_id": obj.id, "operation_id": payment.id, "purchase_id": purchase.id}
        why = _mismatch(payment, obj)
        if why == "payment_not_succeeded" and payment_unsettled(payment):
            # The provider disputes a charge whose answer Verity lost (or a person's word
            # awaits read-back): the dispute is real; it waits for Verity's record.
            return DisputeApplyResult(DisputeApply.WAITING, "payment_not_settled", **ids)
        if why:
            return DisputeApplyResult(DisputeApply.MISMATCH, why, **ids)
        dispute = lock_dispute(obj.id)
        if dispute is not None and dispute.payment_id != payment.id:
            return DisputeApplyResult(DisputeApply.MISMATCH, "payment", **ids)
        source = dispute.status if dispute else ""
        if dispute is None:
            dispute = Dispute(
                id=obj.id,
                purchase=purchase,
                payment=payment,
                charge=obj.charge,
                payment_intent=obj.payment_intent,
                amount=obj.amount,
                currency=obj.currency,
                reason=obj.reason,
                status=obj.status,
                evidence_due_by=_due(obj),
                verification=verification,
                purchase_status_before=purchase.status,
            )
            result = DisputeApply.APPLIED
        else:
            new_rank = DISPUTE_STATUS_RANK[DisputeStatus(obj.status)]
            old_rank = DISPUTE_STATUS_RANK[DisputeStatus(dispute.status)]
            if new_rank > old_rank:
                result = DisputeApply.APPLIED
            elif obj.status == dispute.status:
                result = DisputeApply.NO_CHANGE
            elif new_rank == old_rank == DISPUTE_STATUS_RANK[DisputeStatus.WON]:
                # won vs lost: the provider never changes a closed verdict; a person looks.
                log.warning(
                    "dispute %s: closed %s, evidence says %s", obj.id, dispute.status, obj.status
                )
                return DisputeApplyResult(DisputeApply.CONFLICT, "closed_status_differs", **ids)
            else:
                result = DisputeApply.STALE
        moves = _merge_moves(list(dispute.balance_transactions or []), obj)
        moves_changed = moves != list(dispute.balance_transactions or [])
        due = _due(obj)
        if result == DisputeApply.APPLIED:
            dispute.status = obj.status
            dispute.reason = obj.reason or dispute.reason
            dispute.evidence_due_by = due or dispute.evidence_due_by
            dispute.verification = verification
            if obj.status in DISPUTE_CLOSED_STATUSES:
                dispute.closed_at = timezone.now()
        elif result == DisputeApply.NO_CHANGE and due and due != dispute.evidence_due_by:
            dispute.evidence_due_by = due  # the provider extended the deadline
            result = DisputeApply.APPLIED
        if moves_changed:
            result = DisputeApply.APPLIED if result != DisputeApply.STALE else result
        if result == DisputeApply.NO_CHANGE or (result == DisputeApply.STALE and not moves_changed):
            if (
                result == DisputeApply.NO_CHANGE
                and verification == Verification.PROVIDER
                and dispute.verification != Verification.PROVIDER
            ):
                # the provider's own record confirms what the webhook said
                dispute.verification = verification
                dispute.save(update_fields=["verification", "updated_at"])
            return DisputeApplyResult(result, "", **ids)
        dispute.balance_transactions = moves
        dispute.funds_withdrawn, dispute.funds_reinstated, dispute.fees = _totals(moves)
        dispute.save()
        if source != dispute.status:
            transition_record(
                purchase_id=purchase.id,
                operation=payment,
                field="dispute",
                source=source,
                target=dispute.status,
                cause=cause[:64],
                evidence=obj.safe_fields(),
                actor=actor,
            )
        _follow_purchase(purchase, dispute, cause=cause[:64], actor=actor)
        if dispute.status == DisputeStatus.LOST:
            # The bank gave the buyer the money back: a refund still awaiting approval
            # would pay it back twice. Superseded (declined, audited), as by a
            # compensation; never left in finance's queue.
            from .operations import _supersede_pending_approvals

            _supersede_pending_approvals(
                purchase,
                payment,
                reason=f"superseded by dispute {dispute.id}, lost",
                detail="superseded_by_lost_dispute",
            )
        if payment.is_duplicate and dispute.status in DISPUTE_CLOSED_STATUSES:
            # The bank gave a duplicate's money back to the merchant (won, or an inquiry
            # closed): its compensation now returns what is left (none while it was open).
            duplicate_compensate_locked(purchase=purchase, duplicate=payment)
        outbox_put(
            category=OutboxCategory.DISPUTE_CHANGED,
            payload={"dispute": dispute.id},
            dedupe_key=f"dispute:{dispute.id}:{dispute.status}:{len(moves)}",
        )
    log.info(
        "dispute %s applied status=%s purchase=%s verification=%s",
        obj.id,
        obj.status,
        purchase.id,
        verification,
    )
    return DisputeApplyResult(
        result, "" if result == DisputeApply.APPLIED else "stale_status", **ids
    )


def dispute_refresh(*, dispute_id: str, actor: str = "dispute-readback") -> DisputeApplyResult:
    """Read the dispute back at the provider (no transaction open) and apply what it says.

    The read is recorded as a reconcile ProviderCall on the disputed payment. A provider
    that cannot be read leaves the record as it is (absence of evidence changes nothing).
    """

    assert_outside_transaction()
    dispute = Dispute.objects.select_related("payment").get(id=dispute_id)
    result, obj = payment_provider(provider_for(dispute.payment)).retrieve_dispute(dispute_id)
    ProviderCall.objects.create(
        operation_id=dispute.payment_id,
        purpose=CallPurpose.RECONCILE,
        step=CallStep.RETRIEVE,
        request_id=result.request_id,
        http_status=result.http_status,
        classification=result.classification,
        error_code=result.error_code,
        fault_drill=result.fault_drill,
        safe_fields=obj.safe_fields() if obj else {"object": "dispute", "id": dispute_id},
        finished_at=timezone.now(),
    )
    if obj is None:
        return DisputeApplyResult(
            DisputeApply.NO_CHANGE,
            f"readback:{result.classification}",
            dispute_id,
            dispute.payment_id,
            dispute.purchase_id,
        )
    return dispute_apply_observation(
        obj=obj, verification=Verification.PROVIDER, cause="dispute_readback", actor=actor
    )
