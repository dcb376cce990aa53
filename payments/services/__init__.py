"""Payments services: the only code that writes Purchase and PaymentOperation.

Every function is keyword-only. Errors a caller must show to a client are raised as
`DomainError(code, message, status, retry, owner, purchase=, operation=)`
(payments/errors.py).

One module per section; each imports only the ones above it:
  common -> holds -> purchases; common, holds -> observations -> reconcile -> dispatch;
  operations and manual use reconcile and observations; external (money the provider
  moved without Verity) and disputes use observations and operations; the x402 rail's
  own services: x402_reads (its read-back), x402_refunds (its transfer back, registered
  as the rail's RailEvidence below) and x402_settle (a PAYMENT-SIGNATURE's settle).
The operation's rail picks its provider: `provider_for(op)` (common.py), never a
branch on `op.rail` (docs/architecture.md).
`from payments.services import <name>` keeps working for every public name (and the
few private ones other modules still reach for).
"""

from ..errors import ApplyResult, DomainError

# The x402 rail's own read-back and refund send register themselves on import (its
# RailEvidence): the generic dispatch and read-back reach them through the seam.
from . import x402_refunds  # noqa: F401
from .common import (
    operation_workflow,
    provider_for,
    provider_for_rail,
    rail_evidence_for,
    transition_record,
)
from .dispatch import (
    NOT_SENT_RESENDS,
    RETRYABLE_BACKOFF_BASE_SECONDS,
    RETRYABLE_BACKOFF_CAP_SECONDS,
    RETRYABLE_RESENDS,
    operation_claim_write,
    operation_dispatch,
    operation_dispatch_or_wait,
    payment_money_step,
)
from .dispatch import (
    _claim as _claim,  # the lifecycle machine drives the claim step by step
)
from .dispatch import (
    _HaltedAtClaim as _HaltedAtClaim,
)
from .dispatch import (
    _metadata as _metadata,
)
from .holds import _period_start as _period_start  # read by support's limits page
from .holds import client_limits
from .manual import operation_overturn_review, operation_resolve_manual
from .observations import (
    duplicate_compensate_locked,
    duplicate_compensation_ensure,
    operation_apply_observation,
)
from .operations import (
    capture_create,
    payment_create,
    refund_approve,
    refund_decline,
    refund_request,
    void_create,
)
from .purchases import (
    QUOTE_TTL,
    PurchaseOpened,
    buyer_confirmation_issue,
    purchase_cancel,
    purchase_create,
    purchase_open,
    purchase_transition,
    purchases_expire_stale,
    quote_create,
)
from .reconcile import (
    operation_cancel_unapplied,
    operation_read_canonical,
    operation_reconcile,
    operation_reconcile_on_demand,
    operation_reconcile_read,
    operation_replay,
    operations_reconcile_apply,
    operations_reconcile_prepare,
    operations_sweep_dead_dispatches,
    operations_verify_before_follow_up,
)

__all__ = [
    "ApplyResult",
    "DomainError",
    "NOT_SENT_RESENDS",
    "PurchaseOpened",
    "QUOTE_TTL",
    "RETRYABLE_BACKOFF_BASE_SECONDS",
    "RETRYABLE_BACKOFF_CAP_SECONDS",
    "RETRYABLE_RESENDS",
    "buyer_confirmation_issue",
    "capture_create",
    "client_limits",
    "duplicate_compensate_locked",
    "duplicate_compensation_ensure",
    "operation_apply_observation",
    "operation_cancel_unapplied",
    "operation_claim_write",
    "payment_money_step",
    "operation_dispatch",
    "operation_dispatch_or_wait",
    "operation_overturn_review",
    "operation_read_canonical",
    "operation_reconcile",
    "operation_reconcile_on_demand",
    "operation_reconcile_read",
    "operation_replay",
    "operation_resolve_manual",
    "operation_workflow",
    "operations_reconcile_apply",
    "operations_reconcile_prepare",
    "operations_sweep_dead_dispatches",
    "operations_verify_before_follow_up",
    "payment_create",
    "provider_for",
    "provider_for_rail",
    "purchase_cancel",
    "purchase_create",
    "purchase_open",
    "purchase_transition",
    "purchases_expire_stale",
    "quote_create",
    "rail_evidence_for",
    "refund_approve",
    "refund_decline",
    "refund_request",
    "transition_record",
    "void_create",
]
