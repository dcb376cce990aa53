"""A succeeded x402 payment is read again until its block is final
(docs/x402.md#finality-and-reorgs).

An x402 payment succeeds once its proving log is X402_CONFIRMATIONS deep; the deliverable
goes out then. A reorg can still take the block away, and the payer can then cancel the
authorization (or spend its nonce elsewhere), so the transfer never comes back. So every
succeeded x402 payment is read from the chain again (the beat's `recovery.x402_finality`)
until its block is final -- the RPC's `finalized` tag where it has one, else the
network's depth (X402_FINALITY_BLOCKS, default the network's confirmations floor) -- and
then never again (`X402Authorization.final_at`).

Before that, a read that proves the authorization can no longer move money (cancelled,
used elsewhere, expired) while its transfer is gone turns the payment into a discrepancy
with an owner, never a silent state: the operation is `failed`
(`transfer_reversed_on_chain`, owner support, cause X402_VANISHED_CAUSE), the purchase
goes to manual review, the console lists it (support queue `x402_transfers_reversed`),
`verity_x402_transfers_reversed_open` counts it (alert VerityX402TransferReversed), and
the settled message reverses the revenue in the ledger, unwinds the goods and tells the
customer (recovery.orchestrator). A transfer that left the chain but may still land
(the authorization unused and valid) is read again, not judged.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from recovery.models import OutboxCategory
from recovery.outbox import outbox_put

from ..enums import PAYMENT_KINDS, Grade, Outcome, Owner, Rail, Reason, Verification
from ..locks import lock_purchase_and_operation
from ..models import PaymentOperation, X402Authorization
from ..providers.x402 import ChainStatus, get_chain_reader
from .common import _purchase_to, transition_record
from .holds import _hold_overturn

log = logging.getLogger(__name__)

X402_VANISHED_CAUSE = "x402_transfer_reversed"

# What a finality read found.
FINAL, WATCHING, REVERSED, UNREADABLE = "final", "watching", "reversed", "unreadable"
_GONE = (ChainStatus.CANCELED, ChainStatus.EXPIRED, ChainStatus.USED_ELSEWHERE)


def finality_depth(network: str) -> int:
    """How deep a block must be to be final when the RPC has no `finalized` tag."""
    if settings.X402_FINALITY_BLOCKS > 0:
        blocks: int = settings.X402_FINALITY_BLOCKS
        return blocks
    depth: int = max(
        settings.X402_CONFIRMATIONS,
        settings.X402_CONFIRMATIONS_FLOOR.get(network, settings.X402_DEFAULT_CONFIRMATIONS_FLOOR),
    )
    return depth


def x402_not_final() -> QuerySet[X402Authorization]:
    """Succeeded x402 payments whose block is not known final yet."""
    return X402Authorization.objects.filter(
        final_at__isnull=True,
        operation__rail=Rail.X402,
        operation__kind__in=PAYMENT_KINDS,
        operation__outcome=Outcome.SUCCEEDED,
        operation__grade=Grade.CONFIRMED,
    )


def x402_finality_sweep(limit: int | None = None) -> dict[str, int]:
    """Read each succeeded, not yet final x402 payment once (oldest first)."""
    seen: dict[str, int] = {}
    ids = list(
        x402_not_final()
        .order_by("created_at")
        .values_list("operation_id", flat=True)[: limit or settings.X402_FINALITY_SWEEP_BATCH]
    )
    for op_id in ids:
        found = x402_finality_check(operation_id=op_id)
        seen[found] = seen.get(found, 0) + 1
    return seen


def x402_finality_check(*, operation_id: str) -> str:
    """One read of one succeeded payment: final, still watching, or reversed."""
    auth = X402Authorization.objects.select_related("operation").get(pk=operation_id)
    op = auth.operation
    if auth.final_at is not None or op.outcome != Outcome.SUCCEEDED:
        return FINAL if auth.final_at else WATCHING
    reader = get_chain_reader()
    from_block = (auth.settle_answer or {}).get("search_from_block")
    try:
        view = reader.read(
            payer=auth.payer,
            nonce=auth.nonce,
            valid_before=auth.valid_before,
            transaction=auth.transaction_hash,
            pay_to=auth.pay_to,
            value=int(auth.value),
            from_block=from_block if isinstance(from_block, int) else None,
        )
        final = (
            view.proof_log_index is not None
            and view.block_number is not None
            and reader.is_final(view.block_number, depth=finality_depth(auth.network))
        )
    except Exception as exc:  # noqa: BLE001 - an unreadable chain is no evidence either way
        log.warning("x402 finality read failed operation=%s: %s", operation_id, exc)
        return UNREADABLE
    if view.proof_log_index is not None:
        # Still on chain (perhaps mined again in another block or transaction after a
        # reorg: the new proving log is recorded, claimed once like the first).
        seen: dict[str, object] = dict(
            transaction_hash=view.transaction,
            block_number=view.block_number,
            confirmations=view.confirmations,
            proof_transaction=view.transaction,
            proof_log_index=view.proof_log_index,
        )
        if final:
            seen["final_at"] = timezone.now()
        try:
            with transaction.atomic():
                X402Authorization.objects.filter(pk=operation_id, final_at__isnull=True).update(
                    **seen
                )
        except IntegrityError:
            log.error(
                "x402 operation %s: its proving log %s#%s is claimed by another operation",
                operation_id,
                view.transaction,
                view.proof_log_index,
            )
            return WATCHING
        return FINAL if final else WATCHING
    if view.status in _GONE:
        x402_transfer_reversed(operation_id=operation_id, evidence=view.safe_fields())
        return REVERSED
    # Gone from the chain but the authorization may still move money (unused and valid:
    # the transfer may be mined again), or used with its log out of reach: read again.
    log.warning(
        "x402 operation %s: succeeded, its transfer is not on chain now (%s); read again",
        operation_id,
        view.status,
    )
    return WATCHING


def x402_transfer_reversed(*, operation_id: str, evidence: dict[str, Any]) -> bool:
    """The chain's record overturns a success it once showed: the payment is failed
    (`transfer_reversed_on_chain`), owned by support, the purchase in manual review; the
    settled message reverses the ledger, unwinds the goods and tells the customer."""
    with transaction.atomic():
        purchase, op = lock_purchase_and_operation(operation_id)
        if op.outcome != Outcome.SUCCEEDED:
            return False
        source = op.outcome
        op.reason = Reason.TRANSFER_REVERSED_ON_CHAIN
        op.grade, op.verification = Grade.CONFIRMED, Verification.PROVIDER
        op.settled_at, op.next_action_owner, op.next_reconcile_at = (
            timezone.now(),
            Owner.SUPPORT,
            None,
        )
        op.overturn_to_failed()
        op.save(
            update_fields=[
                "outcome",
                "stage",
                "grade",
                "verification",
                "reason",
                "settled_at",
                "next_action_owner",
                "next_reconcile_at",
                "updated_at",
            ]
        )
        transition_record(
            purchase_id=purchase.id,
            operation=op,
            field="outcome",
            source=source,
            target=op.outcome,
            cause=X402_VANISHED_CAUSE,
            evidence={"chain": evidence},
            actor="x402_finality",
        )
        _hold_overturn(op, succeeded=False)
        outbox_put(
            category=OutboxCategory.OPERATION_SETTLED,
            payload={"operation": op.id},
            dedupe_key=f"settled:{op.id}:x402_reversed",
        )
        _purchase_to(
            purchase, "mark_manual_review", cause=X402_VANISHED_CAUSE, actor="x402_finality"
        )
    log.error(
        "x402 payment %s of purchase %s: its transfer left the chain and the "
        "authorization can no longer pay (%s); revenue reversed, goods unwound, "
        "customer told, support owns it",
        operation_id,
        purchase.id,
        evidence.get("status"),
    )
    return True


def x402_transfers_reversed() -> QuerySet[PaymentOperation]:
    """Payments the chain took back, until support marks them reviewed (the operation's
    next owner is support until then): the console queue."""
    return PaymentOperation.objects.filter(
        rail=Rail.X402,
        outcome=Outcome.FAILED,
        reason=Reason.TRANSFER_REVERSED_ON_CHAIN,
        next_action_owner=Owner.SUPPORT,
    )
