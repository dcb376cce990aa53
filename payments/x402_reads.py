"""Read-only reconciliation of an x402 charge from the chain (DESIGN §4, x402).

Called by payments.services' read-back for operations on rail x402: reads the chain
through the adapter (payments.providers.x402), remembers what it saw on the operation's
X402Authorization row (transaction, block, confirmations), and hands back the
provider-neutral object that the one observation function applies. Never a settle.
"""
from __future__ import annotations

from payments.enums import Classification

from .models import PaymentOperation, X402Authorization
from .providers.base import CallResult
from .providers.x402 import OBJECT_TYPE, get_chain_reader, transfer_object

X402_OBJECT_TYPE = OBJECT_TYPE


def x402_read_back(op: PaymentOperation) -> CallResult:
    auth = X402Authorization.objects.filter(pk=op.id).first()
    if auth is None:  # never persisted: the settle was never called for it
        return CallResult(Classification.NOT_FOUND, detail="no x402 authorization recorded")
    try:
        view = get_chain_reader().read(payer=auth.payer, nonce=auth.nonce,
                                       valid_before=auth.valid_before,
                                       transaction=auth.transaction_hash)
    except Exception as exc:  # noqa: BLE001 - an unreachable chain is absence of evidence
        return CallResult(Classification.UNKNOWN, detail=f"chain read failed: {exc}"[:200])
    X402Authorization.objects.filter(pk=op.id).update(
        transaction_hash=view.transaction or auth.transaction_hash,
        block_number=view.block_number, confirmations=view.confirmations)
    return CallResult(Classification.OK, object=transfer_object(
        view=view, operation_id=op.id, purchase_id=op.purchase_id, amount=op.amount,
        currency=op.currency))
