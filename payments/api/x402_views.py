"""The deliverable endpoint's x402 answers (thin: payments.services.x402_settle does the work).

GET /api/v1/purchases/{id}/deliverable on a purchase the rail is offered for:
- unpaid, no payment in progress -> 402 with `PAYMENT-REQUIRED` (the quote's requirements);
- with `PAYMENT-SIGNATURE` -> settled (or replayed), then by the operation's state:
  succeeded -> 200 the stored deliverable + `PAYMENT-RESPONSE` (202 while it is prepared);
  awaiting/unknown -> 202 "sent, waiting for confirmation; don't pay again";
  failed -> 402 with the requirements again and the stable reason.
"""

from __future__ import annotations

import logging

from django.conf import settings
from rest_framework.response import Response

from recovery.selectors import deliverable_for

from ..enums import PAYMENT_KINDS, Outcome, Owner, PurchaseStatus, Rail, RetryAdvice
from ..errors import DomainError, ErrorCode
from ..models import PaymentOperation, Purchase
from ..providers.x402 import (
    PAYMENT_REQUIRED_HEADER,
    PAYMENT_RESPONSE_HEADER,
    PAYMENT_SIGNATURE_HEADER,
)
from ..selectors import purchase_money
from ..services.x402_settle import (
    encode_header,
    x402_offered,
    x402_pay,
    x402_payment_required,
    x402_payment_response,
)
from . import presenters
from .problems import Problem, problem_from_domain_error
from .ratelimit import x402_settle_hit

__all__ = ["PAYMENT_SIGNATURE_HEADER", "deliverable_pay", "deliverable_state", "deliverable_unpaid"]

_EXPOSE = "Access-Control-Expose-Headers"
# A purchase may be paid over x402 while nothing was paid yet, or the last payment failed.
PAYABLE_STATUSES = (PurchaseStatus.AWAITING_PAYMENT, PurchaseStatus.PAYMENT_FAILED)
log = logging.getLogger(__name__)


def _latest_x402(purchase: Purchase) -> PaymentOperation | None:
    return (
        purchase.operations.filter(kind__in=PAYMENT_KINDS, rail=Rail.X402)
        .order_by("-created_at")
        .first()
    )


def deliverable_unpaid(purchase: Purchase) -> bool:
    """The purchase has no deliverable yet and x402 is how it can be paid (or is being).
    Not once its money went back (refunded, a dispute lost): it serves nothing, and never
    says "paid, being prepared" (docs/reliability.md#rules-every-money-movement-obeys)."""
    if purchase_money(purchase.id).returned:
        return False
    if _latest_x402(purchase) is not None:
        return True
    return x402_offered(purchase) and purchase.status in PAYABLE_STATUSES


def _required(request, purchase: Purchase, *, error: str = "") -> str:
    return encode_header(
        x402_payment_required(
            purchase=purchase, resource_url=request.build_absolute_uri(request.path), error=error
        )
    )


def _network_words(op: PaymentOperation) -> str:
    auth = getattr(op, "x402", None)
    return auth.network if auth else "the network"


def _answer(request, purchase: Purchase, op: PaymentOperation, *, replayed: bool) -> Response:
    headers = {}
    settle = x402_payment_response(op)
    if settle is not None:
        headers[PAYMENT_RESPONSE_HEADER] = encode_header(settle)
        headers[_EXPOSE] = PAYMENT_RESPONSE_HEADER
    if replayed:
        headers["Payment-Replayed"] = "true"
    if op.outcome == Outcome.SUCCEEDED:
        found = deliverable_for(purchase.id)
        if found is not None:
            return Response(
                {
                    "job_reference": found["job_reference"],
                    "result": found["result"],
                    "expires_at": presenters.iso(found["expires_at"]),
                    "operation": op.id,
                },
                status=200,
                headers=headers,
            )
        return Response(
            {
                "code": "deliverable_preparing",
                "operation": op.id,
                "detail": "Paid. The deliverable is being prepared; GET it again "
                "(without paying again).",
            },
            status=202,
            headers={**headers, "Retry-After": "1"},
        )
    if op.outcome == Outcome.FAILED:
        raise Problem(
            code=ErrorCode.PAYMENT_FAILED,
            status=402,
            retry=RetryAdvice.NEW_OPERATION,
            owner=Owner.BUYER,
            purchase=purchase.id,
            operation=op.id,
            detail=f"The payment failed ({op.reason or 'failed'}); nothing was "
            "charged. Sign a new authorization to pay.",
            headers={
                **headers,
                PAYMENT_REQUIRED_HEADER: _required(
                    request, purchase, error=op.reason or "payment_failed"
                ),
                _EXPOSE: f"{PAYMENT_REQUIRED_HEADER}, {PAYMENT_RESPONSE_HEADER}",
            },
            extra={"reason": op.reason or None},
        )
    if op.outcome == Outcome.AWAITING_PROVIDER:
        code, detail = (
            "settlement_pending",
            f"Your payment was sent and is waiting for "
            f"confirmation on {_network_words(op)}. Don't pay again.",
        )
    else:
        # Not known to be sent, nor known not to be: the signed authorization may still
        # land until it expires on chain. Never "nothing was charged" before then.
        code, detail = (
            "payment_unknown",
            f"Your payment's outcome is not known yet: it "
            f"may still be transferred on {_network_words(op)} until the "
            f"authorization expires. Don't pay again; GET this again later.",
        )
    return Response(
        {
            "code": code,
            "operation": op.id,
            "outcome": op.outcome,
            "detail": detail,
            "next_action": presenters.operation_view(op)["next_action"],
        },
        status=202,
        headers={**headers, "Retry-After": "5"},
    )


def _settle_gate(request, purchase: Purchase):
    """The per-API-client limit on x402 settle attempts: each one costs chain
    reads, a facilitator call and its gas. Refused before anything is stored."""

    def gate() -> None:
        client = request.auth
        try:
            decision = x402_settle_hit(client_id=client.pk, rate=settings.X402_SETTLE_RATE)
        except Exception:  # noqa: BLE001 - the cache is Redis; an outage must not 500
            log.warning("x402 settle limiter unavailable; attempt allowed", exc_info=True)
            return
        if not decision.allowed:
            raise Problem(
                code=ErrorCode.X402_SETTLE_RATE_LIMITED,
                status=429,
                retry=RetryAdvice.SAME_KEY,
                owner=Owner.BUYER,
                purchase=purchase.id,
                detail=f"Too many x402 payment attempts from this API client "
                f"(limit {settings.X402_SETTLE_RATE}). Nothing was charged "
                f"or stored; retry the same payment after "
                f"{decision.wait_seconds} s.",
                headers={"Retry-After": str(decision.wait_seconds)},
            )

    return gate


def deliverable_pay(request, purchase: Purchase, header: str) -> Response:
    try:
        result = x402_pay(
            purchase_id=purchase.id,
            api_client=request.auth,
            header=header,
            settle_gate=_settle_gate(request, purchase),
        )
    except DomainError as exc:
        if exc.status != 402:
            raise
        # A payment that cannot pay this resource: 402 with PAYMENT-REQUIRED carrying the
        # spec's reason (x402 v2 HTTP transport), Verity's code and words in the body.
        problem = problem_from_domain_error(exc)
        problem.headers.update(
            {
                PAYMENT_REQUIRED_HEADER: _required(
                    request, purchase, error=str(exc.extra.get("error") or exc.code)
                ),
                _EXPOSE: PAYMENT_REQUIRED_HEADER,
            }
        )
        raise problem from exc
    return _answer(request, purchase, result.operation, replayed=result.replayed)


def deliverable_state(request, purchase: Purchase) -> Response:
    op = _latest_x402(purchase)
    if op is None or (op.outcome == Outcome.FAILED and purchase.status in PAYABLE_STATUSES):
        raise Problem(
            code=ErrorCode.PAYMENT_REQUIRED,
            status=402,
            retry=RetryAdvice.NEW_OPERATION,
            owner=Owner.BUYER,
            purchase=purchase.id,
            detail="Pay for this deliverable: repeat the request with a "
            "PAYMENT-SIGNATURE header built from PAYMENT-REQUIRED (x402 v2).",
            headers={
                PAYMENT_REQUIRED_HEADER: _required(request, purchase),
                _EXPOSE: PAYMENT_REQUIRED_HEADER,
            },
        )
    return _answer(request, purchase, op, replayed=True)
