"""Read-only reconciliation of an x402 charge from the chain
(docs/x402.md#reconciled-from-the-chain-only).

The x402 rail's read-back (its `RailEvidence.read_back`, registered in
payments/services/x402_refunds.py): reads the chain through the adapter
(payments.providers.x402), remembers what it saw on the operation's X402Authorization
row (transaction, block, confirmations), and hands back the provider-neutral object that
the one observation function applies. Never a settle.
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction

from ..enums import PAYMENT_KINDS, Classification, OperationKind, Outcome
from ..models import PaymentOperation, X402Authorization, X402RefundTransfer
from ..providers.base import CallResult
from ..providers.x402 import (
    OBJECT_TYPE,
    ChainStatus,
    X402Transfer,
    get_chain_reader,
    read_refund_transfer,
    transfer_object,
)
from .common import transition_record

log = logging.getLogger(__name__)

# The history row of a read whose proving log another operation already claimed.
PROOF_CLAIM_REFUSED_CAUSE = "x402_proof_claim_refused"


def x402_operation_read_back(op: PaymentOperation) -> CallResult:
    """The chain, read-only: never a second settle
    (docs/x402.md#reconciled-from-the-chain-only). A payment by its
    authorization; a refund by its transfer back (receipt and Transfer log)."""
    if op.kind in PAYMENT_KINDS:
        return x402_read_back(op)
    if op.kind == OperationKind.REFUND:
        return x402_refund_read_back(op)
    return CallResult(Classification.REJECTED, detail=f"no {op.kind} on the x402 rail")


def x402_read_back(op: PaymentOperation) -> CallResult:
    auth = X402Authorization.objects.filter(pk=op.id).first()
    if auth is None:  # never persisted: the settle was never called for it
        return CallResult(Classification.NOT_FOUND, detail="no x402 authorization recorded")
    # Paid only by THIS authorization's Transfer(payer -> pay_to, value) (the log right
    # after its AuthorizationUsed); the log search starts where the nonce was read unused
    # before the settle.
    from_block = (auth.settle_answer or {}).get("search_from_block")
    try:
        view = get_chain_reader().read(
            payer=auth.payer,
            nonce=auth.nonce,
            valid_before=auth.valid_before,
            transaction=auth.transaction_hash,
            pay_to=auth.pay_to,
            value=int(auth.value),
            from_block=from_block if isinstance(from_block, int) else None,
        )
    except Exception as exc:  # noqa: BLE001 - an unreachable chain is absence of evidence
        return CallResult(Classification.UNKNOWN, detail=f"chain read failed: {exc}"[:200])
    seen = dict(
        transaction_hash=view.transaction or auth.transaction_hash,
        block_number=view.block_number,
        confirmations=view.confirmations,
    )
    if view.proof_log_index is not None:
        # The proving log is claimed by this operation, once: the database refuses a log
        # another operation already counted (x402_one_op_per_proving_log).
        seen.update(proof_transaction=view.transaction, proof_log_index=view.proof_log_index)
    try:
        with transaction.atomic():
            X402Authorization.objects.filter(pk=op.id).update(**seen)
    except IntegrityError:
        owner = (
            X402Authorization.objects.filter(
                network=auth.network,
                asset=auth.asset,
                proof_transaction=view.transaction,
                proof_log_index=view.proof_log_index,
            )
            .exclude(pk=op.id)
            .values_list("operation_id", flat=True)
            .first()
        )
        log.error(
            "x402 operation %s: its proving log %s#%s is already counted for "
            "operation %s; not paid by it",
            op.id,
            view.transaction,
            view.proof_log_index,
            owner,
        )
        # Someone tried to count one transfer twice: on the operation's history (the
        # metric verity_x402_proof_claims_refused and its alert count these rows).
        transition_record(
            purchase_id=op.purchase_id,
            operation=op,
            field="outcome",
            source=op.outcome,
            target=op.outcome,
            cause=PROOF_CLAIM_REFUSED_CAUSE,
            actor="reconciler",
            evidence={
                "proof_transaction": view.transaction,
                "proof_log_index": view.proof_log_index,
                "claimed_by": owner,
            },
        )
        # No verdict: a log that pays another operation never pays this one; a person
        # decides (the operation stays open, in the unknown queue).
        return CallResult(
            Classification.UNKNOWN,
            detail=f"proving log {view.transaction}#{view.proof_log_index} "
            f"already counted for operation {owner}"[:200],
        )
    return CallResult(
        Classification.OK,
        object=transfer_object(
            view=view,
            operation_id=op.id,
            purchase_id=op.purchase_id,
            amount=op.amount,
            currency=op.currency,
        ),
    )


def x402_refund_read_back(op: PaymentOperation) -> CallResult:
    """A refund's transfer back, read from the chain: its receipt (confirmations) and the
    Transfer log signer -> payer of the value. Never a send.

    No hash stored is "nothing moved" only once nothing can be sent any more.
    The signer stores the hash before it broadcasts, and both its sign and that
    store are a compare-and-set under the operation's row lock (still `dispatching`, same
    claim: payments.services.dispatch). So: while the operation is `dispatching` a send
    can still happen — no verdict, still in flight; once it is not, any hash that will
    ever exist is already stored. The operation's outcome is read from the database
    *before* the claim row, so a hash stored in between is seen."""
    dispatching = PaymentOperation.objects.filter(id=op.id, outcome=Outcome.DISPATCHING).exists()
    row = X402RefundTransfer.objects.filter(pk=op.id).first()
    if dispatching and (row is None or not row.transaction_hash):
        return CallResult(
            Classification.UNKNOWN, detail="in flight: the send is claimed and may still be signed"
        )
    if row is None or not row.transaction_hash:
        return CallResult(
            Classification.OK,
            object=X402Transfer(
                OBJECT_TYPE,
                id="",
                status=ChainStatus.INVALID,
                amount=op.amount,
                currency=op.currency,
                failure_code="provider_unreachable",
                metadata={"operation_id": op.id, "purchase_id": op.purchase_id},
            ),
        )
    try:
        view = read_refund_transfer(
            transaction=row.transaction_hash,
            sender=row.from_address,
            nonce=row.chain_nonce,
            to=row.to_address,
            value=int(row.value),
        )
    except Exception as exc:  # noqa: BLE001 - an unreachable chain is absence of evidence
        return CallResult(Classification.UNKNOWN, detail=f"chain read failed: {exc}"[:200])
    X402RefundTransfer.objects.filter(pk=op.id).update(
        block_number=view.block_number, confirmations=view.confirmations
    )
    if dispatching and view.status == ChainStatus.INVALID:
        # The stored transaction cannot move money, but the send is still out: its signer
        # may sign again at a fresh nonce (a taken nonce). Its own answer decides.
        return CallResult(
            Classification.UNKNOWN,
            detail="in flight: the stored transfer failed; the send is still out",
        )
    failure = "provider_failed" if view.status == ChainStatus.INVALID else ""
    return CallResult(
        Classification.OK,
        object=X402Transfer(
            OBJECT_TYPE,
            id=view.transaction,
            status=view.status,
            amount=op.amount,
            currency=op.currency,
            failure_code=failure,
            metadata={"operation_id": op.id, "purchase_id": op.purchase_id},
        ),
    )
