"""The x402 rail: pay for a purchase's deliverable with an EIP-3009 authorization.

Verity is the resource server (seller). The deliverable endpoint without payment answers
402 with the requirements built from the accepted quote; the agent repeats it with
PAYMENT-SIGNATURE and this service settles it in three phases (claim in a transaction, call the
facilitator outside any, apply in a second):

1. one transaction: the same guards as any payment (payments.services.payment_create,
   rail x402: one money movement at a time, at most one success, limits, currency), the
   authorization persisted (payer, nonce, validBefore, value, signature hash), the
   settle step claimed once and the hold reserved;
2. the facilitator's settle, with no transaction open;
3. its answer applied through the one observation function
   (operation_apply_observation), classified as docs/x402.md#how-a-settle-is-classified says.

Idempotency: (payer, nonce) and the `payment-identifier` extension id identify the
operation. The same payload again is a replay of the operation's *current* state, never
a second settle; the same identity with a different payload is 409. After an answer that
proves nothing, the chain decides (payments.services.x402_reads, read-only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from babel.numbers import get_currency_precision
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from ..enums import (
    PAYMENT_KINDS,
    CallStep,
    Classification,
    Outcome,
    Owner,
    Rail,
    RetryAdvice,
    Verification,
)
from ..errors import DomainError, ErrorCode
from ..locks import assert_outside_transaction
from ..models import (
    ApiClient,
    PaymentOperation,
    Product,
    ProviderCall,
    Purchase,
    X402Authorization,
)
from ..providers import x402 as adapter
from ..providers.base import ProviderObject
from .dispatch import operation_claim_write
from .observations import operation_apply_observation
from .operations import payment_create
from .reconcile import operation_reconcile_on_demand, operations_verify_before_follow_up
from .x402_reads import x402_read_back

_PAYABLE = ("awaiting_payment", "payment_failed")


@dataclass(frozen=True)
class X402Result:
    operation: PaymentOperation
    replayed: bool


def x402_offered(purchase: Purchase) -> bool:
    """The rail is on, the quote's currency is the asset's, and the purchase has a
    deliverable (a digital good) to sell as the resource."""
    if not settings.X402_ENABLED or not settings.X402_ASSET or not settings.X402_PAY_TO:
        return False
    if purchase.currency.lower() != settings.X402_CURRENCY.lower():
        return False
    skus = [i.get("sku") for i in (purchase.quote.items or [])]
    return Product.objects.filter(sku__in=skus, kind=Product.Kind.DIGITAL).exists()


def amount_atomic(purchase: Purchase) -> int:
    """Minor units of the quote -> atomic units of the asset (USDC: 6 decimals)."""
    exponent = get_currency_precision(purchase.currency.upper())
    shift = settings.X402_DECIMALS - exponent
    if shift < 0:
        raise DomainError(
            ErrorCode.RAIL_NOT_AVAILABLE,
            "This currency cannot be paid with the configured asset.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            purchase=purchase.id,
        )
    atomic: int = purchase.amount * 10**shift
    return atomic


def x402_requirements(purchase: Purchase) -> dict[str, Any]:
    return adapter.requirements_for(
        amount_atomic=amount_atomic(purchase),
        network=settings.X402_NETWORK,
        asset=settings.X402_ASSET,
        pay_to=settings.X402_PAY_TO,
        max_timeout_seconds=settings.X402_MAX_TIMEOUT_SECONDS,
        token_name=settings.X402_TOKEN_NAME,
        token_version=settings.X402_TOKEN_VERSION,
    )


def x402_payment_required(
    *, purchase: Purchase, resource_url: str, error: str = ""
) -> dict[str, Any]:
    return adapter.payment_required(
        requirements=x402_requirements(purchase),
        resource_url=resource_url,
        description=f"Deliverable of purchase {purchase.id}",
        error=error,
    )


def _refuse(
    code: str,
    detail: str,
    *,
    status: int = 422,
    purchase: str | None = None,
    operation: str | None = None,
) -> DomainError:
    return DomainError(
        code,
        detail,
        status=status,
        retry=RetryAdvice.FORBIDDEN,
        owner=Owner.BUYER,
        purchase=purchase,
        operation=operation,
    )


def _refuse_payment(code: str, x402_error: str, detail: str, *, purchase: str) -> DomainError:
    """A payment that cannot pay this resource: 402 with PAYMENT-REQUIRED, as the x402 v2
    HTTP transport answers it (payments.api.x402_views adds the header). `x402_error` is the
    spec's/SDK's reason (x402.mechanisms.evm.constants), `code` Verity's stable word."""
    return DomainError(
        code,
        f"{detail} Nothing was charged; sign a new authorization from PAYMENT-REQUIRED.",
        status=402,
        retry=RetryAdvice.NEW_OPERATION,
        owner=Owner.BUYER,
        purchase=purchase,
        extra={"error": x402_error},
    )


# The x402 SDK's reason codes (x402.mechanisms.evm.constants, the spec's error reasons).
ERR_UNSUPPORTED_SCHEME = "unsupported_scheme"
ERR_NETWORK_MISMATCH = "network_mismatch"
ERR_NO_MATCHING_REQUIREMENTS = "No matching payment requirements"  # the SDK server's words
ERR_RECIPIENT_MISMATCH = "invalid_exact_evm_payload_recipient_mismatch"
ERR_VALUE_MISMATCH = "invalid_exact_evm_payload_authorization_value_mismatch"
ERR_VALID_BEFORE = "invalid_exact_evm_payload_authorization_valid_before"
ERR_VALID_AFTER = "invalid_exact_evm_payload_authorization_valid_after"
ERR_NONCE_USED = "invalid_exact_evm_nonce_already_used"
ERR_INSUFFICIENT_BALANCE = "invalid_exact_evm_insufficient_balance"
ERR_SIGNATURE = "invalid_exact_evm_payload_signature"

# A buyer's clock may run ahead of Verity's; the SDK client signs validBefore = now +
# maxTimeoutSeconds. Beyond that (plus this) the buyer would choose how long Verity's
# operation stays unresolved and leave a usable authorization behind a failure.
VALID_BEFORE_SKEW_SECONDS = 60
# The EIP-3009 transfer method: the only one Verity checks and settles.
_EIP3009 = "eip3009"


def _check_against_requirements(purchase: Purchase, signed: adapter.SignedPayment) -> None:
    """Everything Verity can check itself before anything is stored or sent."""
    req = x402_requirements(purchase)
    acc = signed.accepted

    def refuse(code: str, error: str, detail: str) -> DomainError:
        return _refuse_payment(code, error, detail, purchase=purchase.id)

    if acc.get("scheme") != req["scheme"]:
        raise refuse(
            "payment_requirements_mismatch",
            ERR_UNSUPPORTED_SCHEME,
            "Only the exact scheme is accepted.",
        )
    if acc.get("network") != req["network"]:
        raise refuse(
            "payment_requirements_mismatch",
            ERR_NETWORK_MISMATCH,
            f"Only {req['network']} is accepted.",
        )
    method = (acc.get("extra") or {}).get("assetTransferMethod", _EIP3009)
    if (
        str(acc.get("asset", "")).lower() != req["asset"].lower()
        or str(acc.get("payTo", "")).lower() != req["payTo"].lower()
        or str(acc.get("amount")) != req["amount"]
        or method != _EIP3009
    ):
        # A Permit2 transfer method would make the facilitator settle something Verity
        # never checked: only EIP-3009 is accepted.
        raise refuse(
            "payment_requirements_mismatch",
            ERR_NO_MATCHING_REQUIREMENTS,
            "The payment does not match this purchase's requirements (scheme, "
            "network, asset, pay_to, amount, EIP-3009 transfer method).",
        )
    if adapter.signature_refused_by_token(signed):
        # The token would revert it (a malleated high-s signature, v not 27/28): the
        # facilitator's broadcast would burn gas and hold the purchase until validBefore.
        raise refuse(
            "authorization_invalid",
            ERR_SIGNATURE,
            "The signature is not in the form the token accepts (s in the lower "
            "half of the curve order, v 27 or 28).",
        )
    if signed.to.lower() != req["payTo"].lower():
        raise refuse(
            "payment_requirements_mismatch",
            ERR_RECIPIENT_MISMATCH,
            "The authorization does not pay this purchase's pay_to.",
        )
    if signed.value != req["amount"]:
        raise refuse(
            "payment_requirements_mismatch",
            ERR_VALUE_MISMATCH,
            "The authorization's value is not this purchase's amount.",
        )
    now = int(time.time())
    if signed.valid_before < now + settings.X402_MIN_VALIDITY_SECONDS:
        raise refuse(
            "authorization_expires_too_soon",
            ERR_VALID_BEFORE,
            "The authorization expires too soon to be settled.",
        )
    if signed.valid_before > now + int(req["maxTimeoutSeconds"]) + VALID_BEFORE_SKEW_SECONDS:
        # Expiry is Verity's only "provably not paid" verdict: the buyer may not push it
        # beyond the requirement's maxTimeoutSeconds.
        raise refuse(
            "authorization_expires_too_late",
            ERR_VALID_BEFORE,
            f"validBefore lies beyond now + maxTimeoutSeconds ({req['maxTimeoutSeconds']} s).",
        )
    if signed.valid_after > now:
        raise refuse(
            "authorization_not_yet_valid", ERR_VALID_AFTER, "The authorization is not valid yet."
        )


def _check_on_chain(purchase: Purchase, signed: adapter.SignedPayment) -> int:
    """Cheap checks before an operation exists and /settle is paid for: the EIP-712 signer
    recovered locally, then one block's reads of the token (the nonce unused -- EIP-3009
    nonces are the payer's, any transfer of theirs may have spent it --, the balance).
    Returns the block at which the nonce was read unused: the log search starts there."""
    signer_ok = adapter.signature_matches(
        signed,
        chain_id=_chain_id(),
        token_name=settings.X402_TOKEN_NAME,
        token_version=settings.X402_TOKEN_VERSION,
        asset=settings.X402_ASSET,
    )
    try:
        seen = adapter.get_chain_reader().precheck(payer=signed.payer, nonce=signed.nonce)
    except adapter.ChainMismatch as exc:  # a deployment error: nothing stored or sent
        raise DomainError(
            ErrorCode.CHAIN_MISMATCH,
            "The payment rail is misconfigured (its chain is "
            "not the one it offers); nothing was charged. Try later.",
            status=503,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            purchase=purchase.id,
            extra={"retry_after": 60},
        ) from exc
    except Exception as exc:  # noqa: BLE001 - nothing was stored or sent
        raise DomainError(
            ErrorCode.CHAIN_UNREACHABLE,
            "The chain cannot be read right now; nothing "
            "was charged. Send the same PAYMENT-SIGNATURE again later.",
            status=503,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            purchase=purchase.id,
            extra={"retry_after": 5},
        ) from exc
    try:
        adapter.get_facilitator().ensure_supported(scheme="exact", network=settings.X402_NETWORK)
    except adapter.FacilitatorUnsupported as exc:  # a deployment error: nothing stored
        raise DomainError(
            ErrorCode.FACILITATOR_UNSUPPORTED,
            "The payment rail is misconfigured "
            "(its facilitator does not take this payment); nothing was "
            "charged. Try later.",
            status=503,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            purchase=purchase.id,
            extra={"retry_after": 60},
        ) from exc
    if not signer_ok and not seen.is_contract:
        # An EOA's signature must recover to it (a contract wallet's is EIP-1271's: the
        # facilitator's verify judges it).
        raise _refuse_payment(
            "authorization_invalid",
            ERR_SIGNATURE,
            "The signature is not the payer's.",
            purchase=purchase.id,
        )
    if seen.used:
        raise _refuse_payment(
            "authorization_used",
            ERR_NONCE_USED,
            "This authorization's nonce is already used on chain.",
            purchase=purchase.id,
        )
    if seen.balance < int(signed.value):
        raise _refuse_payment(
            "insufficient_balance",
            ERR_INSUFFICIENT_BALANCE,
            "The payer's balance does not cover the amount.",
            purchase=purchase.id,
        )
    return seen.block


def _chain_id() -> int:
    return int(settings.X402_NETWORK.split(":", 1)[1])


def _existing(
    purchase: Purchase, signed: adapter.SignedPayment, api_client: ApiClient
) -> PaymentOperation | None:
    """The operation this authorization (or payment identifier) already names, or None;
    409 when the identity is reused with a different payload. The authorization (payer,
    nonce) is one on chain, whoever sends it; a payment identifier is the buyer's own
    idempotency key and names a payment among its API client's only: another client's
    identical identifier is neither found nor refused. Ids of another API client's purchase
    or operation are never shown (the 409 still refuses)."""
    client_id = api_client.id if api_client is not None else None
    match = Q(payer=signed.payer, nonce=signed.nonce)
    if signed.payment_identifier:
        match |= Q(payment_identifier=signed.payment_identifier, api_client_id=client_id)
    for auth in X402Authorization.objects.filter(match).select_related("operation__purchase"):
        op = auth.operation
        own = api_client is not None and op.purchase.api_client_id == api_client.id
        op_id, purchase_id = (op.id, op.purchase_id) if own else (None, purchase.id)
        same_auth = auth.payer == signed.payer and auth.nonce == signed.nonce
        if same_auth and auth.signature_hash != signed.signature_hash:
            raise _refuse(
                "authorization_reused",
                "This authorization nonce was already used with a different signature.",
                status=409,
                purchase=purchase_id,
                operation=op_id,
            )
        if (
            signed.payment_identifier
            and auth.payment_identifier == signed.payment_identifier
            and auth.api_client_id == client_id
            and not same_auth
        ):
            raise _refuse(
                "payment_identifier_reused",
                "This payment identifier was already used with a different payment.",
                status=409,
                purchase=purchase_id,
                operation=op_id,
            )
        if op.purchase_id != purchase.id:
            raise _refuse(
                "authorization_reused",
                "This authorization already pays another purchase.",
                status=409,
                purchase=purchase.id,
                operation=op_id,
            )
        return op
    return None


def _phase1(
    *,
    purchase: Purchase,
    api_client: ApiClient,
    signed: adapter.SignedPayment,
    checked_block: int | None = None,
) -> tuple[PaymentOperation, ProviderCall | None]:
    last_failed = (
        purchase.operations.filter(kind__in=PAYMENT_KINDS, outcome=Outcome.FAILED)
        .exclude(retried_by__isnull=False)
        .order_by("-created_at")
        .first()
    )
    if last_failed is not None:
        # A new authorization after a failed one is a retry of it on purpose; a failure
        # that is only a person's word is read back first
        # (docs/reliability.md#the-providers-record-outranks-a-person).
        operations_verify_before_follow_up(purchase_id=purchase.id)
    with transaction.atomic():
        op = payment_create(
            purchase_id=purchase.id,
            api_client=api_client,
            payment_method=f"x402:{signed.payer}",
            retry_of=last_failed.id if last_failed else None,
            rail=Rail.X402,
        )
        with transaction.atomic():
            X402Authorization.objects.create(
                operation=op,
                network=settings.X402_NETWORK,
                asset=settings.X402_ASSET,
                pay_to=settings.X402_PAY_TO,
                payer=signed.payer,
                nonce=signed.nonce,
                value=signed.value,
                valid_after=signed.valid_after,
                valid_before=signed.valid_before,
                signature_hash=signed.signature_hash,
                payload_hash=signed.payload_hash,
                payment_identifier=signed.payment_identifier,
                api_client=api_client,
                settle_answer={"search_from_block": checked_block},
            )
        call = operation_claim_write(operation_id=op.id, step=CallStep.SETTLE)
    return PaymentOperation.objects.get(id=op.id), call


_CLASSIFICATION = {
    adapter.SettleKind.SUCCESS: Classification.OK,
    adapter.SettleKind.PENDING: Classification.OK,
    adapter.SettleKind.INVALID: Classification.DECLINED,
    adapter.SettleKind.NOT_SENT: Classification.NOT_SENT,
    adapter.SettleKind.UNKNOWN: Classification.UNKNOWN,
}


def _answer_object(op: PaymentOperation, answer: adapter.SettleAnswer) -> ProviderObject:
    if answer.kind == adapter.SettleKind.SUCCESS:
        # The facilitator's word is never the proof of money, on any chain: the chain's
        # read-back decides (_success_read_back). Without a proof yet: in flight.
        status = adapter.ChainStatus.PENDING
    elif answer.kind == adapter.SettleKind.PENDING:
        status = adapter.ChainStatus.PENDING
    elif answer.kind == adapter.SettleKind.INVALID:
        status = adapter.ChainStatus.INVALID
    elif answer.kind == adapter.SettleKind.NOT_SENT:
        status = adapter.ChainStatus.INVALID  # provably never left: nothing can have moved
    else:
        status = adapter.ChainStatus.UNKNOWN
    failure = answer.reason or (
        "provider_unreachable" if answer.kind == adapter.SettleKind.NOT_SENT else ""
    )
    # A "success" names a transaction the read-back has not tied to this authorization:
    # it is not adopted as the operation's reference (the proof's transaction will be).
    reference = "" if answer.kind == adapter.SettleKind.SUCCESS else answer.transaction
    return adapter.X402Transfer(
        adapter.OBJECT_TYPE,
        id=reference,
        status=status,
        amount=op.amount,
        currency=op.currency,
        failure_code=failure,
        metadata={"operation_id": op.id, "purchase_id": op.purchase_id},
    )


def _success_read_back(op: PaymentOperation) -> ProviderObject | None:
    """After a facilitator's "success": what the chain shows of THIS authorization (its
    AuthorizationUsed log and the Transfer right after it, the receipt's confirmations),
    never the transaction hash the facilitator named -- it may be anyone's. A verdict
    (confirmed, used elsewhere, expired, cancelled) is applied as the chain's; nothing
    yet (unused, unreadable) leaves the operation in flight for the reconciler."""
    result = x402_read_back(op)
    obj = result.object
    if (
        result.classification != Classification.OK
        or obj is None
        or obj.status in (adapter.ChainStatus.UNUSED, adapter.ChainStatus.UNKNOWN)
    ):
        return None
    return obj


def _is_facilitator_refusal(answer: adapter.SettleAnswer) -> bool:
    """A refusal that is only the facilitator's word: an `invalid_*` verdict, or a refused
    credential (401/403). Not a connection Verity itself saw refused (nothing left it)."""
    return answer.kind == adapter.SettleKind.INVALID or (
        answer.kind == adapter.SettleKind.NOT_SENT and answer.http_status is not None
    )


def _refusal_read_back(op: PaymentOperation, answer: adapter.SettleAnswer) -> ProviderObject:
    """After a facilitator's refusal: the chain decides, never the refusal. A facilitator
    may broadcast the transfer (or keep the signed authorization and send it later) and
    still answer a refusal. The chain's view is applied when it has one (the transfer
    proven or in flight; cancelled, expired or used elsewhere, each at the confirmation
    depth); while the authorization is unused and still valid it may land at any time, so
    the operation is unknown and the reconciler keeps reading it until it lands or can no
    longer be used -- never failed on the refusal alone."""
    result = x402_read_back(op)
    obj = result.object
    if (
        result.classification == Classification.OK
        and obj is not None
        and obj.status not in (adapter.ChainStatus.UNUSED, adapter.ChainStatus.UNKNOWN)
    ):
        return obj
    return adapter.X402Transfer(
        adapter.OBJECT_TYPE,
        id=answer.transaction,
        status=adapter.ChainStatus.UNKNOWN,
        amount=op.amount,
        currency=op.currency,
        metadata={"operation_id": op.id, "purchase_id": op.purchase_id},
    )


def _search_from_block(op: PaymentOperation) -> int | None:
    auth = X402Authorization.objects.filter(pk=op.id).only("settle_answer").first()
    return (auth.settle_answer or {}).get("search_from_block") if auth else None


def _settle_outside_transaction(
    op: PaymentOperation, call: ProviderCall, signed: adapter.SignedPayment, purchase: Purchase
) -> None:
    assert_outside_transaction()
    requirements = x402_requirements(purchase)
    answer = adapter.get_facilitator().settle(
        payload=adapter.forwarded_payload(signed, requirements),
        requirements=requirements,
        payer=signed.payer,
        nonce=signed.nonce,
    )
    ProviderCall.objects.filter(id=call.id).update(
        http_status=answer.http_status,
        classification=_CLASSIFICATION[answer.kind],
        error_code=answer.error_reason[:64],
        fault_drill=answer.fault_drill,
        finished_at=timezone.now(),
        safe_fields={**answer.body, "detail": answer.detail},
    )
    # Phase 3. The answer is remembered first (it carries the transaction hash).
    X402Authorization.objects.filter(pk=op.id).update(
        settle_answer={
            **answer.body,
            "kind": answer.kind,
            "search_from_block": _search_from_block(op),
        },
        transaction_hash=answer.transaction or "",
    )
    obj = _answer_object(op, answer)
    if answer.kind == adapter.SettleKind.SUCCESS:
        obj = _success_read_back(op) or obj
    elif _is_facilitator_refusal(answer):
        obj = _refusal_read_back(op, answer)
    operation_apply_observation(
        operation_id=op.id, obj=obj, source=Verification.PROVIDER, cause=f"settle_{answer.kind}"
    )
    if PaymentOperation.objects.filter(id=op.id, outcome=Outcome.DISPATCHING).exists():
        # The answer named nothing applicable: what happened is unknown, the chain decides.
        operation_apply_observation(
            operation_id=op.id,
            obj=adapter.X402Transfer(
                adapter.OBJECT_TYPE,
                id=answer.transaction,
                status=adapter.ChainStatus.UNKNOWN,
                amount=op.amount,
                currency=op.currency,
                metadata={"operation_id": op.id},
            ),
            source=Verification.PROVIDER,
            cause="settle_no_verdict",
        )


def _refreshed(op: PaymentOperation) -> PaymentOperation:
    """A replay of an open operation reads the chain first (read-only, rate-limited per
    operation): the agent's retry learns what happened, it never causes a second settle."""
    if op.outcome in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER):
        operation_reconcile_on_demand(operation_id=op.id, actor="x402_replay")
    return PaymentOperation.objects.select_related("purchase").get(id=op.id)


def x402_pay(
    *,
    purchase_id: str,
    api_client: ApiClient,
    header: str,
    settle_gate: Callable[[], None] | None = None,
) -> X402Result:
    """Settle (or replay) one PAYMENT-SIGNATURE for a purchase. Bad input changes nothing.
    `settle_gate` (the per-client settle limit, payments.api.x402_views) runs once a new
    attempt passed the local checks, before the chain reads and the settle; it raises to
    refuse. Replays never reach it."""
    purchase = Purchase.objects.select_related("quote").get(id=purchase_id)
    if not x402_offered(purchase):
        raise _refuse(
            "rail_not_available",
            "x402 payment is not offered for this purchase.",
            status=409,
            purchase=purchase.id,
        )
    try:
        signed = adapter.parse_payment_signature(header)
    except adapter.PaymentSignatureInvalid as exc:
        raise _refuse(
            "payment_signature_invalid", str(exc), status=400, purchase=purchase.id
        ) from exc
    existing = _existing(purchase, signed, api_client)
    if existing is not None:
        return X402Result(_refreshed(existing), replayed=True)
    _check_against_requirements(purchase, signed)
    if settle_gate is not None:
        settle_gate()
    try:
        checked_block = _check_on_chain(purchase, signed)
    except DomainError:
        # Our own settle of a concurrent identical request may have used the nonce since.
        existing = _existing(purchase, signed, api_client)
        if existing is not None:
            return X402Result(_refreshed(existing), replayed=True)
        raise
    try:
        op, call = _phase1(
            purchase=purchase, api_client=api_client, signed=signed, checked_block=checked_block
        )
    except (IntegrityError, DomainError):
        # A concurrent request with the same authorization won the race: replay its state.
        existing = _existing(purchase, signed, api_client)
        if existing is not None:
            return X402Result(_refreshed(existing), replayed=True)
        raise
    if call is not None:
        _settle_outside_transaction(op, call, signed, purchase)
    return X402Result(
        PaymentOperation.objects.select_related("purchase").get(id=op.id), replayed=False
    )


def x402_payment_response(op: PaymentOperation) -> dict[str, Any] | None:
    """The PAYMENT-RESPONSE body for an operation's current state (None before settle)."""
    auth = X402Authorization.objects.filter(pk=op.id).first()
    if auth is None:
        return None
    if op.outcome == Outcome.SUCCEEDED:
        return adapter.settle_response(
            success=True,
            transaction=auth.transaction_hash,
            network=auth.network,
            payer=auth.payer,
            amount=auth.value,
        )
    reason = {
        Outcome.AWAITING_PROVIDER: "settlement_pending",
        Outcome.UNKNOWN: "settlement_unknown",
        Outcome.DISPATCHING: "settlement_in_progress",
    }.get(op.outcome, op.reason or "failed")
    return adapter.settle_response(
        success=False,
        transaction=auth.transaction_hash,
        network=auth.network,
        payer=auth.payer,
        error_reason=reason,
    )


def encode_header(value: dict[str, Any]) -> str:
    return adapter.encode_header(value)
