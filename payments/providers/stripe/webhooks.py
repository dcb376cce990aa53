"""Stripe webhook verification and normalisation.

Besides the adapter (`api.py` beside it) this is the only module that imports
`stripe`: signature checking is the SDK's (`WebhookSignature.verify_header`), so a
constant-time compare and the header grammar are Stripe's, not ours.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import stripe
from django.conf import settings

from ..base import BalanceMove, DisputeObject, ProviderObject
from .objects import StripeObject


class WebhookVerificationError(Exception):
    """A delivery Verity must refuse without writing anything.

    `reason` is a stable label (also the metrics label): missing_signature,
    bad_signature, stale_signature, malformed.
    """

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


def _header_timestamp(sig_header: str) -> int | None:
    for item in sig_header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def verify_and_parse(
    payload: bytes, sig_header: str | None, secrets: list[str], tolerance: int
) -> dict[str, Any]:
    """Verify `Stripe-Signature` against every configured secret (rotation); parse.

    The signature is checked first without the time window and then with it, so a
    correctly signed but old delivery is told apart (stale) from a forged one (bad).
    Stripe's own check only refuses old timestamps; a timestamp further than the
    tolerance in the future is refused too (it would extend a captured delivery's
    replay window).
    """
    if not sig_header:
        raise WebhookVerificationError("missing_signature")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise WebhookVerificationError("malformed", "body is not UTF-8") from None
    usable = [s for s in secrets if s and s.strip()]

    def signed_with(window: int | None) -> bool:
        for secret in usable:
            try:
                stripe.WebhookSignature.verify_header(text, sig_header, secret, window)
            except stripe.SignatureVerificationError:
                continue
            return True
        return False

    # A fresh delivery is verified once, with the time window; only a refused one is
    # checked again without it, to tell a stale delivery from a forged one.
    if not signed_with(tolerance):
        raise WebhookVerificationError("stale_signature" if signed_with(None) else "bad_signature")
    ts = _header_timestamp(sig_header)
    if ts is None or (tolerance and ts > time.time() + tolerance):
        raise WebhookVerificationError("stale_signature")
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        raise WebhookVerificationError("malformed", "body is not JSON") from None
    if (
        not isinstance(event, dict)
        or not isinstance(event.get("id"), str)
        or not event["id"]
        or not isinstance(event.get("type"), str)
        or not isinstance((event.get("data") or {}).get("object"), dict)
    ):
        raise WebhookVerificationError("malformed", "not a Stripe event")
    return event


# -- normalisation -------------------------------------------------------------------

_SAFE_METADATA = ("operation_id", "purchase_id", "customer_reference")


def _id_of(value: object) -> str:
    """`latest_charge`/`payment_intent`/`charge` are embedded objects on localstripe
    and ids on Stripe (unless expanded)."""
    if isinstance(value, dict):
        return str(value.get("id") or "")
    return str(value or "")


def event_account(event: dict[str, Any]) -> str:
    """A missing `account` means the platform account
    (docs/webhooks.md#which-account-an-event-is-about)."""
    account = event.get("account")
    if account is not None and not isinstance(account, str):
        return ""  # malformed: `event_shape_problem` rejects such an event at ingestion
    return account or getattr(settings, "STRIPE_ACCOUNT", "") or ""


def _metadata_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return {}
    return {k: str(v) for k, v in meta.items() if k in _SAFE_METADATA}


def event_shape_problem(event: dict[str, Any]) -> str:
    """Why a signed event cannot be an event Verity may apply, or ''. Such an event is
    stored as `rejected` (the signature is good, so the delivery is answered 2xx)."""
    if (
        "account" in event
        and event["account"] is not None
        and not isinstance(event["account"], str)
    ):
        return "malformed:account"
    obj = event["data"]["object"]
    if "metadata" in obj and obj["metadata"] is not None and not isinstance(obj["metadata"], dict):
        return "malformed:metadata"
    if event_created_at(event) is None and isinstance(event.get("created"), int):
        # An instant no datetime holds (year > 9999): stored rejected, not a 500 the
        # provider would retry for days.
        return "malformed:created"
    return ""


def event_created_at(event: dict[str, Any]) -> datetime | None:
    """The event's `created` as an aware datetime, or None (absent, or out of range)."""
    created = event.get("created")
    if not isinstance(created, int):
        return None
    try:
        return datetime.fromtimestamp(created, tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None


def safe_event_payload(event: dict[str, Any]) -> dict[str, Any]:
    """The fields Verity stores of an event. Never card details, billing details,
    customer PII or client secrets: only ids, status, money and our own metadata."""
    obj = event["data"]["object"]
    error = obj.get("last_payment_error") or {}
    safe_obj = {
        "id": str(obj.get("id") or ""),
        "object": str(obj.get("object") or ""),
        "status": str(obj.get("status") or ""),
        "amount": obj.get("amount") if isinstance(obj.get("amount"), int) else None,
        "currency": str(obj.get("currency") or ""),
        "metadata": _metadata_of(obj),
        "payment_intent": _id_of(obj.get("payment_intent")),
        "latest_charge": _id_of(obj.get("latest_charge")),
        "last_payment_error": (
            {"code": str(error.get("code") or "")} if isinstance(error, dict) and error else None
        ),
    }
    if safe_obj["object"] == "refund":
        safe_obj["failure_reason"] = str(obj.get("failure_reason") or "")
        safe_obj["charge"] = _id_of(obj.get("charge"))
    if safe_obj["object"] == "payment_intent":
        safe_obj["capture_method"] = str(obj.get("capture_method") or "")
    if safe_obj["object"] == "charge":
        amount_refunded = obj.get("amount_refunded")
        safe_obj["amount_refunded"] = amount_refunded if isinstance(amount_refunded, int) else None
        amount_captured = obj.get("amount_captured")
        safe_obj["amount_captured"] = amount_captured if isinstance(amount_captured, int) else None
    if safe_obj["object"] == "dispute":
        safe_obj.update(_safe_dispute_fields(obj))
    return {
        "id": event["id"],
        "type": event["type"],
        "account": event_account(event),
        "created": event.get("created") if isinstance(event.get("created"), int) else None,
        "data": {"object": safe_obj},
    }


def object_from_event_payload(event: dict[str, Any]) -> ProviderObject:
    """Normalise `data.object` (a PaymentIntent or Refund) of a raw or stored-safe event.

    Works on both the raw delivery and `safe_event_payload`'s output, so processing in
    the worker reads only what was stored.
    """
    obj = event["data"]["object"]
    object_type = str(obj.get("object") or "")
    error = obj.get("last_payment_error") or {}
    failure_code = ""
    if isinstance(error, dict) and error:
        failure_code = str(error.get("code") or error.get("decline_code") or "")
    if object_type == "refund":
        failure_code = str(obj.get("failure_reason") or "")
    amount = obj.get("amount")
    return StripeObject(
        object_type=object_type,
        id=str(obj.get("id") or ""),
        status=str(obj.get("status") or ""),
        amount=amount if isinstance(amount, int) else -1,
        currency=str(obj.get("currency") or "").lower(),
        metadata=_metadata_of(obj),
        account=event_account(event),
        latest_charge=_id_of(obj.get("latest_charge")),
        payment_intent=_id_of(obj.get("payment_intent")),
        failure_code=failure_code,
        has_payment_error=bool(error),
        capture_method=str(obj.get("capture_method") or ""),
    )


# -- disputes ------------------------------------------------------------------------


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _safe_balance_transactions(value: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for txn in value or []:
        if not isinstance(txn, dict):
            continue  # an unexpanded id: nothing to book from it
        amount, fee = _int(txn.get("amount")), _int(txn.get("fee"))
        out.append(
            {
                "id": str(txn.get("id") or ""),
                "amount": amount,
                "fee": fee,
                "net": _int(txn.get("net"), amount - fee),
                "currency": str(txn.get("currency") or "").lower(),
                "reporting_category": str(txn.get("reporting_category") or ""),
            }
        )
    return out


def _safe_dispute_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """A Dispute's safe fields: the evidence (names, e-mails, receipts, free text) is never
    kept -- only its deadline."""
    details = obj.get("evidence_details") or {}
    due_by = details.get("due_by") if isinstance(details, dict) else None
    return {
        "charge": _id_of(obj.get("charge")),
        "reason": str(obj.get("reason") or "")[:40],
        "evidence_due_by": _int(due_by, 0) or None,
        "balance_transactions": _safe_balance_transactions(obj.get("balance_transactions")),
        "is_charge_refundable": bool(obj.get("is_charge_refundable")),
    }


def dispute_from_payload(obj: dict[str, Any], *, account: str) -> DisputeObject:
    """Normalise a Dispute (a raw or stored-safe event object, or a read-back)."""
    fields = {**obj, **_safe_dispute_fields(obj)} if "evidence_details" in obj else obj
    moves = tuple(
        BalanceMove(
            id=b["id"],
            amount=b["amount"],
            fee=b["fee"],
            net=b["net"],
            currency=b["currency"],
            reporting_category=b.get("reporting_category", ""),
        )
        for b in _safe_balance_transactions(fields.get("balance_transactions"))
    )
    return DisputeObject(
        id=str(fields.get("id") or ""),
        status=str(fields.get("status") or ""),
        amount=_int(fields.get("amount"), -1),
        currency=str(fields.get("currency") or "").lower(),
        reason=str(fields.get("reason") or "")[:40],
        charge=_id_of(fields.get("charge")),
        payment_intent=_id_of(fields.get("payment_intent")),
        evidence_due_by=_int(fields.get("evidence_due_by"), 0) or None,
        balance_transactions=moves,
        account=account,
        is_charge_refundable=bool(fields.get("is_charge_refundable")),
    )


def dispute_from_event_payload(event: dict[str, Any]) -> DisputeObject:
    return dispute_from_payload(event["data"]["object"], account=event_account(event))
