"""Follow-up of a dispute change: read it back at the provider, then book its ledger
entries (each provider balance transaction once) -- the DISPUTE_CHANGED outbox handler.

Ledger (double entry, debits positive), per balance transaction of the dispute:
  dispute_withdrawal     disputed +amount          provider_balance -amount
  dispute_fee            fees +fee                 provider_balance -fee
  dispute_reinstatement  provider_balance +amount  disputed -amount
and, once a dispute is lost, dispute_loss: revenue +(withdrawn - reinstated), disputed -…
The provider_balance rows carry the dispute id as their reference, the `source` of the
provider's balance transactions, so the settlement comparison matches them.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from payments.enums import (
    DISPUTE_CLOSED_STATUSES,
    DisputeStatus,
    OperationKind,
    Outcome,
)
from payments.models import Dispute, Purchase
from payments.selectors import purchase_money
from payments.services.disputes import dispute_refresh

from .models import LedgerAccount, OutboxCategory
from .orchestrator import (
    FULFILLABLE_STATUSES,
    duplicate_return_book,
    fulfilment_unfinished,
    purchase_goods_unwind,
)
from .outbox import outbox_put, run_steps_put
from .steps import PaymentInfo, _ledger_pair, ledger_record_sale

log = logging.getLogger(__name__)


def dispute_ledger_book(*, dispute_id: str) -> int:
    """Book what the stored dispute says; idempotent (unique per entry). Returns the
    number of balance transactions considered."""

    dispute = Dispute.objects.select_related("payment").get(id=dispute_id)
    moves = list(dispute.balance_transactions or [])
    payment = dispute.payment
    with transaction.atomic():
        if moves and payment.kind == OperationKind.CHARGE and payment.outcome == Outcome.SUCCEEDED:
            # A dispute can open before fulfilment ever ran: the purchase is no longer paid,
            # so the ledger step never books the sale the withdrawal takes back. Book it
            # here first (idempotent: the ledger step books the same rows).
            ledger_record_sale(
                purchase_id=dispute.purchase_id,
                payment=PaymentInfo(
                    id=payment.id,
                    kind=payment.kind,
                    amount=payment.amount,
                    currency=payment.currency,
                    provider_reference=payment.provider_reference or "",
                    provider_charge=payment.provider_charge or "",
                ),
            )
        if moves and payment.is_duplicate:
            # The duplicate's sale is booked (above): its returns already made net it out.
            for refund in payment.children.filter(
                kind=OperationKind.REFUND, outcome=Outcome.SUCCEEDED
            ):
                duplicate_return_book(refund)
        for move in moves:
            common = {
                "purchase_id": dispute.purchase_id,
                "operation_id": move["id"][:40],
                "provider_reference": dispute.id,
                "currency": move["currency"] or dispute.currency,
            }
            amount, fee = int(move["amount"]), int(move["fee"])
            if amount < 0:
                _ledger_pair(
                    **common,
                    entry_type="dispute_withdrawal",
                    debit=LedgerAccount.DISPUTED,
                    credit=LedgerAccount.PROVIDER_BALANCE,
                    amount=-amount,
                )
            elif amount > 0:
                _ledger_pair(
                    **common,
                    entry_type="dispute_reinstatement",
                    debit=LedgerAccount.PROVIDER_BALANCE,
                    credit=LedgerAccount.DISPUTED,
                    amount=amount,
                )
            if fee:
                _ledger_pair(
                    **common,
                    entry_type="dispute_fee",
                    debit=LedgerAccount.FEES,
                    credit=LedgerAccount.PROVIDER_BALANCE,
                    amount=fee,
                )
        lost = dispute.funds_withdrawn - dispute.funds_reinstated
        if dispute.status == DisputeStatus.LOST and lost > 0:
            _ledger_pair(
                purchase_id=dispute.purchase_id,
                operation_id=dispute.id[:40],
                provider_reference=dispute.id,
                entry_type="dispute_loss",
                debit=LedgerAccount.REVENUE,
                credit=LedgerAccount.DISPUTED,
                amount=lost,
                currency=dispute.currency,
            )
    return len(moves)


def dispute_changed(*, dispute_id: str) -> None:
    """Read back first (outside any transaction; a failed read changes nothing), then book."""

    try:
        dispute_refresh(dispute_id=dispute_id)
    except Exception:  # the provider's read-back is a refresh, not a precondition
        log.warning("dispute read-back failed dispute=%s", dispute_id, exc_info=True)
    dispute_ledger_book(dispute_id=dispute_id)
    dispute_fulfilment_follow(dispute_id=dispute_id)


def dispute_fulfilment_follow(*, dispute_id: str) -> str:
    """An open dispute pauses fulfilment (steps run only on a fulfillable purchase). Once it
    closes, what is left follows the MONEY (docs/reliability.md, "Goods follow the money"),
    not the status recorded when the dispute opened:
    - the money went back to the buyer (the dispute lost, or a full refund or a void,
      whenever it came): nothing more ships, an order already made is cancelled, stock goes
      back, the deliverable is withdrawn and the customer told (as after a void);
    - the merchant kept it (won, an inquiry withdrawn) and the purchase is fulfillable
      again: the remaining steps resume (each once: the orchestrator skips the steps done).
    Returns what it did: `resumed`, `order_cancelled` or `nothing`. Idempotent."""

    dispute = Dispute.objects.select_related("payment").get(id=dispute_id)
    if dispute.payment.is_duplicate:
        # A duplicate charge's dispute neither pauses nor cancels the real order: the
        # purchase's own payment paid for it.
        return "nothing"
    if purchase_money(dispute.purchase_id).returned:
        if purchase_goods_unwind(
            purchase_id=dispute.purchase_id,
            detail=f"dispute {dispute_id} {dispute.status}: the money went back, order cancelled",
        ):
            return "order_cancelled"
        return "nothing"
    status = Purchase.objects.filter(id=dispute.purchase_id).values_list("status", flat=True).get()
    if not fulfilment_unfinished(dispute.purchase_id):
        return "nothing"
    if status in FULFILLABLE_STATUSES:
        with transaction.atomic():
            run_steps_put(purchase_id=dispute.purchase_id)
        log.info(
            "fulfilment resumed after dispute=%s status=%s purchase=%s",
            dispute_id,
            dispute.status,
            dispute.purchase_id,
        )
        return "resumed"
    return "nothing"


def disputes_refresh_open() -> int:
    """Beat job: queue a read-back of every open dispute (a missed or late webhook cannot
    leave one stale). Finds work and writes outbox rows only; one per dispute per hour."""

    hour = timezone.now().strftime("%Y%m%d%H")
    ids = list(
        Dispute.objects.exclude(status__in=DISPUTE_CLOSED_STATUSES).values_list("id", flat=True)
    )
    with transaction.atomic():
        for dispute_id in ids:
            outbox_put(
                category=OutboxCategory.DISPUTE_CHANGED,
                payload={"dispute": dispute_id},
                dedupe_key=f"dispute-refresh:{dispute_id}:{hour}",
            )
    return len(ids)
