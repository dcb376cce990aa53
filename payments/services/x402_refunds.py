"""The x402 rail's refund: a separate token transfer back to the payer, from the refund
signer, in three phases like every dispatch (claim; sign, store the hash and broadcast
with no transaction open; apply the answer through the one observation function). It is
the rail's `RailEvidence` (payments.services.common): registered below, so the generic
dispatch and read-back reach it through the seam and never import it.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..enums import CallStep, Classification, Outcome, Rail, Verification
from ..errors import ApplyResult
from ..locks import (
    assert_outside_transaction,
    lock_operation,
    lock_purchase_and_operation,
    signer_lock,
)
from ..models import PaymentOperation, ProviderCall, X402Authorization, X402RefundTransfer
from ..providers import x402 as x402_adapter
from ..providers.base import ProviderObject
from .common import RailEvidence, log, rail_evidence_register
from .dispatch import _claim
from .observations import (
    _mismatch,
    _overturn_locked,
    _settle_without_object,
    operation_apply_observation,
)
from .reconcile import _read_back
from .x402_reads import x402_operation_read_back


def _refund_claim(op: PaymentOperation) -> tuple[ProviderCall, X402RefundTransfer] | None:
    """Phase 1 of an x402 refund: the send is claimed once (one claim per step) and its claim row
    (one per refund, so never two transfers back) written in the same transaction."""
    with transaction.atomic():
        call = _claim(op.id, CallStep.REFUND, from_pending=True)
        if call is None:
            return None
        auth = X402Authorization.objects.get(pk=op.parent_id)
        # The charge's atomic value scaled to this refund (exact: value = amount * 10^k).
        parent = op.parent
        assert parent is not None  # a refund's parent is the payment it returns
        value = int(auth.value) * op.amount // parent.amount
        try:
            with transaction.atomic():
                row = X402RefundTransfer.objects.create(
                    operation=op,
                    network=auth.network,
                    asset=auth.asset,
                    from_address=x402_adapter.get_refund_sender().address,
                    to_address=auth.payer,
                    value=str(value),
                )
        except IntegrityError:
            return None  # already claimed: its transfer is the only one
        return call, row


def _refund_object(op: PaymentOperation, answer: x402_adapter.RefundAnswer) -> ProviderObject:
    kinds = x402_adapter.SettleKind
    if answer.kind == kinds.SUCCESS:
        status = (
            x402_adapter.ChainStatus.CONFIRMED
            if settings.X402_CONFIRMATIONS <= 1
            else x402_adapter.ChainStatus.PENDING
        )
    else:
        status = {
            kinds.PENDING: x402_adapter.ChainStatus.PENDING,
            kinds.INVALID: x402_adapter.ChainStatus.INVALID,
            kinds.NOT_SENT: x402_adapter.ChainStatus.INVALID,
        }.get(answer.kind, x402_adapter.ChainStatus.UNKNOWN)
    failure = answer.reason or ("provider_unreachable" if answer.kind == kinds.NOT_SENT else "")
    return x402_adapter.X402Transfer(
        x402_adapter.OBJECT_TYPE,
        id=answer.transaction,
        status=status,
        amount=op.amount,
        currency=op.currency,
        failure_code=failure,
        metadata={"operation_id": op.id, "purchase_id": op.purchase_id},
    )


def _refund_wait_slice() -> float:
    """How often a refund waiting for the signer renews its lease: well inside it."""
    lease: float = settings.DISPATCH_LEASE_SECONDS
    return max(0.2, min(5.0, lease / 4))


def _refund_keep_claim(operation_id: str, call_id: int) -> None:
    """The compare-and-set of an x402 refund's send, under the operation's
    row lock: it is still `dispatching` and its claimed send (this ProviderCall, no answer
    recorded) is still open; if so its lease is renewed, else ClaimLost. Run before the
    signer's nonce read and sign, before the hash is stored (and so before the broadcast),
    and between slices of a wait for the signer: a live wait is never swept as dead, and
    a refund settled or swept meanwhile signs and sends nothing."""
    with transaction.atomic():
        op = lock_operation(operation_id)
        open_claim = ProviderCall.objects.filter(
            id=call_id, operation_id=operation_id, finished_at__isnull=True
        ).exists()
        if op.outcome != Outcome.DISPATCHING or not open_claim:
            raise x402_adapter.ClaimLost(f"operation {op.outcome}")
        op.dispatch_deadline = timezone.now() + timedelta(seconds=settings.DISPATCH_LEASE_SECONDS)
        op.save(update_fields=["dispatch_deadline", "updated_at"])


def _refund_conflict(op: PaymentOperation, answer: x402_adapter.RefundAnswer) -> None:
    """The signer's answer contradicts an outcome already settled (the operation was
    settled while this send was out). Never dropped: the chain's own record decides (the
    receipt and its Transfer log, payments.services.x402_reads); a transfer back it shows
    overturns a `failed` to succeeded (the refund's room is taken again, a person is told)."""
    log.warning(
        "x402 refund %s: the signer's answer %s conflicts with %s; reading the chain",
        op.id,
        answer.kind,
        PaymentOperation.objects.get(id=op.id).outcome,
    )
    read = _read_back(PaymentOperation.objects.select_related("purchase", "parent").get(id=op.id))
    obj = read.object if read.classification == Classification.OK else None
    if obj is None or obj.status != x402_adapter.ChainStatus.CONFIRMED:
        return  # no proof on chain (yet): the settled outcome stands
    with transaction.atomic():
        purchase, locked = lock_purchase_and_operation(op.id)
        if locked.outcome == Outcome.FAILED and not _mismatch(locked, obj):
            _overturn_locked(
                purchase,
                locked,
                Outcome.SUCCEEDED,
                verification=Verification.PROVIDER,
                cause="refund_transfer_on_chain",
                actor="dispatcher",
                evidence=obj.safe_fields(),
                reason="",
                obj=obj,
            )


def x402_refund_send(op: PaymentOperation) -> None:
    """A refund on the x402 rail is a separate token transfer back to the payer, from the
    refund signer: claim (phase 1), sign + persist the hash + broadcast with no transaction
    open (phase 2), the answer through the one observation function (phase 3). A lost
    answer is `unknown` and reconciled from the receipt (payments.services.x402_reads)."""
    claimed = _refund_claim(op)
    if claimed is None:
        return
    call, row = claimed
    assert_outside_transaction()

    def still_claimed() -> None:
        _refund_keep_claim(op.id, call.id)

    def on_signed(tx_hash: str, nonce: int) -> None:
        # The hash is stored before the broadcast, and only while this send still holds
        # its claim (same transaction, the operation's row lock): once the operation is
        # settled or swept, no hash can be stored and nothing can leave.
        with transaction.atomic():
            _refund_keep_claim(op.id, call.id)
            X402RefundTransfer.objects.filter(pk=op.id).update(
                transaction_hash=tx_hash, chain_nonce=nonce
            )

    sender = x402_adapter.get_refund_sender()
    wait_slice = _refund_wait_slice()
    # One nonce allocator for the signer across processes: a refund signed elsewhere can
    # neither refuse nor replace this one at its nonce. Waiting for it keeps the lease.
    answer = sender.send(
        to=row.to_address,
        value=int(row.value),
        on_signed=on_signed,
        serialize=lambda: signer_lock(
            sender.address, while_waiting=still_claimed, wait_slice_seconds=wait_slice
        ),
        still_claimed=still_claimed,
        wait_slice_seconds=wait_slice,
    )
    ProviderCall.objects.filter(id=call.id).update(
        classification={
            x402_adapter.SettleKind.SUCCESS: Classification.OK,
            x402_adapter.SettleKind.PENDING: Classification.OK,
            x402_adapter.SettleKind.INVALID: Classification.DECLINED,
            x402_adapter.SettleKind.NOT_SENT: Classification.NOT_SENT,
        }.get(answer.kind, Classification.UNKNOWN),
        fault_drill=answer.fault_drill,
        finished_at=timezone.now(),
        safe_fields={
            "kind": answer.kind,
            "transaction": answer.transaction,
            "block_number": answer.block_number,
            "detail": answer.detail,
        },
    )
    if answer.aborted:
        # Settled or swept by someone else before anything of this send left: theirs.
        log.warning(
            "x402 refund %s: claim lost before the send (%s); nothing sent", op.id, answer.detail
        )
        return
    if answer.block_number is not None:
        X402RefundTransfer.objects.filter(pk=op.id).update(
            block_number=answer.block_number, confirmations=1
        )
    applied = operation_apply_observation(
        operation_id=op.id,
        obj=_refund_object(op, answer),
        source=Verification.PROVIDER,
        cause=f"refund_transfer_{answer.kind}",
    )
    if applied == ApplyResult.CONFLICT:
        _refund_conflict(op, answer)
        return
    if PaymentOperation.objects.filter(id=op.id, outcome=Outcome.DISPATCHING).exists():
        _settle_without_object(
            op.id,
            Outcome.UNKNOWN,
            reason="",
            cause="refund_transfer_no_verdict",
            evidence={"kind": answer.kind, "transaction": answer.transaction},
        )


rail_evidence_register(
    Rail.X402, RailEvidence(read_back=x402_operation_read_back, refund_send=x402_refund_send)
)
