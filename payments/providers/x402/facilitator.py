"""The facilitator client: `FacilitatorClient.settle` is a thin HTTP client of our own. The
SDK's `HTTPFacilitatorClient` raises on any non-200 and drops the body, and a hosted
facilitator answers `settlement_pending` as HTTP 500 (docs/x402.md): we keep the status
*and* the body and classify them here (docs/x402.md#how-a-settle-is-classified).

Fault drills (test mode): `arm_drill(payer, nonce, mode)` makes the next settle of that
authorization misbehave after the real request, like the Stripe adapter's
FaultDrillHTTPClient: nothing about the facilitator is faked.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, TypedDict

import requests
from django.conf import settings

from .auth import FacilitatorAuth, FacilitatorCredentialInvalid, NoAuth, facilitator_auth
from .objects import DrillMode, SettleKind, never_connected

# Verify reasons that prove the facilitator refused before broadcasting anything and that
# the same authorization would be refused again. Deliberately NOT here: a used nonce (it
# may be our own earlier transfer), an expired `validBefore` (the chain decides), and any
# `transaction_failed` (a broadcast may have happened).
_INVALID_REASONS = {
    "invalid_exact_evm_payload_signature": "authorization_invalid",
    "invalid_exact_evm_payload_recipient_mismatch": "authorization_invalid",
    "invalid_exact_evm_payload_authorization_value_mismatch": "authorization_invalid",
    "invalid_exact_evm_payload_authorization_valid_after": "authorization_invalid",
    "invalid_exact_evm_payload_undeployed_smart_wallet": "authorization_invalid",
    "invalid_exact_evm_failed_to_verify_signature": "authorization_invalid",
    "invalid_exact_evm_token_name_mismatch": "authorization_invalid",
    "invalid_exact_evm_token_version_mismatch": "authorization_invalid",
    "invalid_exact_evm_eip3009_not_supported": "authorization_invalid",
    "invalid_exact_evm_failed_to_get_network_config": "authorization_invalid",
    "invalid_exact_evm_insufficient_balance": "insufficient_balance",
    "missing_eip712_domain": "authorization_invalid",
    "network_mismatch": "authorization_invalid",
    "unsupported_scheme": "authorization_invalid",
    "eip6492_factory_not_allowed": "authorization_invalid",
    "asset_not_deployed_contract": "authorization_invalid",
}


@dataclass(frozen=True)
class SettleAnswer:
    """One settle request, classified (docs/x402.md#how-a-settle-is-classified)."""

    kind: str
    http_status: int | None = None
    transaction: str = ""
    network: str = ""
    error_reason: str = ""
    reason: str = ""  # Verity's stable reason for `invalid`
    # The facilitator's SettleResponse, its safe fields.
    body: dict[str, Any] = field(default_factory=dict)
    fault_drill: str = ""
    detail: str = ""


class _Answered(TypedDict):
    """What every SettleAnswer of one answer carries, whatever its kind."""

    http_status: int | None
    transaction: str
    network: str
    error_reason: str
    body: dict[str, Any]


def classify_settle(status: int | None, body: object) -> SettleAnswer:
    """Pure: an HTTP status and the (possibly absent) JSON body -> SettleAnswer."""
    body = body if isinstance(body, dict) else {}
    tx = str(body.get("transaction") or "")
    network = str(body.get("network") or "")
    reason = str(body.get("errorReason") or "")
    safe = {
        k: body[k]
        for k in ("success", "errorReason", "payer", "transaction", "network", "amount")
        if k in body
    }
    common: _Answered = {
        "http_status": status,
        "transaction": tx,
        "network": network,
        "error_reason": reason,
        "body": safe,
    }
    if status == 200 and body.get("success") is True and tx:
        return SettleAnswer(SettleKind.SUCCESS, **common)
    if status in (401, 403) and not tx:
        # The credential was refused: the facilitator did nothing with the payload.
        return SettleAnswer(
            SettleKind.NOT_SENT, detail=f"facilitator refused the credential ({status})", **common
        )
    # Pending is pending whatever the status line says (one hosted facilitator sends 500).
    if reason == "settlement_pending" and tx:
        return SettleAnswer(SettleKind.PENDING, **common)
    if (
        status is not None
        and status < 500
        and body.get("success") is False
        and not tx
        and reason in _INVALID_REASONS
    ):
        return SettleAnswer(SettleKind.INVALID, reason=_INVALID_REASONS[reason], **common)
    # 5xx, a failure after a possible broadcast (hash or not), a used nonce, anything else.
    return SettleAnswer(SettleKind.UNKNOWN, **common)


class FacilitatorUnsupported(RuntimeError):
    """The facilitator's /supported does not list the configured scheme and network."""


class FacilitatorClient:
    def __init__(
        self, *, base_url: str, timeout: float, auth: FacilitatorAuth | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.auth = auth or NoAuth()
        self._drills: dict[str, str] = {}
        self._lock = threading.Lock()
        self._supported: set[tuple[str, str]] = set()

    def _headers(self, method: str, url: str) -> dict[str, str]:
        # A hosted facilitator authenticates every call: a static bearer token, or (the CDP
        # facilitator) a JWT minted for this method, host and path (x402/auth.py).
        return self.auth.headers(method=method, url=url)

    def ensure_supported(self, *, scheme: str, network: str) -> None:
        """Once per process: the facilitator's /supported lists (x402 v2, scheme, network).
        Raises FacilitatorUnsupported on a definite "no" (or a refused credential); an
        unreachable facilitator is left to the settle's own classification."""
        if (scheme, network) in self._supported:
            return
        try:
            url = f"{self.base_url}/supported"
            resp = requests.get(url, headers=self._headers("GET", url), timeout=(3.0, 10.0))
        except requests.exceptions.RequestException:
            return
        if resp.status_code in (401, 403):
            raise FacilitatorUnsupported(
                f"the facilitator refused Verity's credential "
                f"({resp.status_code}): X402_FACILITATOR_AUTH_TOKEN "
                "or X402_FACILITATOR_API_KEY_ID / _SECRET"
            )
        try:
            kinds = resp.json().get("kinds") or []
        except (ValueError, AttributeError):
            return
        if resp.status_code != 200:
            return
        if not any(
            k.get("scheme") == scheme and k.get("network") == network and k.get("x402Version") == 2
            for k in kinds
            if isinstance(k, dict)
        ):
            raise FacilitatorUnsupported(
                f"the facilitator does not support {scheme} on {network} (x402 v2)"
            )
        self._supported.add((scheme, network))

    # -- fault drills (test mode) ---------------------------------------------------
    def arm_drill(self, *, payer: str, nonce: str, mode: str) -> None:
        if mode not in DrillMode.ALL:
            raise ValueError(f"unknown x402 drill {mode}")
        if not settings.FAULT_DRILLS_ENABLED:
            raise RuntimeError("fault drills are disabled")
        with self._lock:
            self._drills[f"{payer.lower()}:{nonce.lower()}"] = mode

    def _take_drill(self, payer: str, nonce: str) -> str:
        with self._lock:
            return self._drills.pop(f"{payer.lower()}:{nonce.lower()}", "")

    # -- settle -----------------------------------------------------------------------
    def settle(
        self, *, payload: dict[str, Any], requirements: dict[str, Any], payer: str, nonce: str
    ) -> SettleAnswer:
        drill = self._take_drill(payer, nonce)
        body = {"x402Version": 2, "paymentPayload": payload, "paymentRequirements": requirements}
        try:
            url = f"{self.base_url}/settle"
            resp = requests.post(
                url, json=body, headers=self._headers("POST", url), timeout=(3.0, self.timeout)
            )
        except requests.exceptions.ConnectTimeout as exc:
            return SettleAnswer(SettleKind.NOT_SENT, detail=f"connect timeout: {exc}"[:200])
        except requests.exceptions.ConnectionError as exc:
            # Refused before anything was written vs. reset after: only the former is safe.
            if never_connected(exc):
                return SettleAnswer(SettleKind.NOT_SENT, detail=f"not sent: {exc}"[:200])
            return SettleAnswer(SettleKind.UNKNOWN, detail=f"connection lost: {exc}"[:200])
        except requests.exceptions.Timeout as exc:
            return SettleAnswer(SettleKind.UNKNOWN, detail=f"read timeout: {exc}"[:200])
        if drill == DrillMode.DROP_ANSWER_AFTER_SEND:
            return SettleAnswer(
                SettleKind.UNKNOWN,
                fault_drill=drill,
                detail="fault drill: answer dropped after the request",
            )
        try:
            parsed = resp.json()
        except ValueError:
            parsed = None
        return classify_settle(resp.status_code, parsed)


_facilitator: FacilitatorClient | None = None
_facilitator_built_from: tuple[object, ...] = ()
_lock = threading.Lock()


def get_facilitator() -> FacilitatorClient:
    """The facilitator client of the current settings (rebuilt when one changes). A
    credential that cannot be used (a malformed API key secret) raises
    FacilitatorUnsupported: the settle answers 503 and stores nothing."""
    global _facilitator, _facilitator_built_from
    # Compared by digest: the secrets stay in settings only, not in another long-lived
    # object an error report could show.
    built_from = (
        settings.X402_FACILITATOR_URL.rstrip("/"),
        settings.X402_FACILITATOR_TIMEOUT,
        settings.X402_FACILITATOR_API_KEY_ID,
        hashlib.sha256(
            f"{settings.X402_FACILITATOR_AUTH_TOKEN}\0"
            f"{settings.X402_FACILITATOR_API_KEY_SECRET}".encode()
        ).hexdigest(),
    )
    with _lock:
        if _facilitator is None or _facilitator_built_from != built_from:
            try:
                auth = facilitator_auth(
                    token=settings.X402_FACILITATOR_AUTH_TOKEN,
                    key_id=settings.X402_FACILITATOR_API_KEY_ID,
                    key_secret=settings.X402_FACILITATOR_API_KEY_SECRET,
                )
            except FacilitatorCredentialInvalid as exc:
                raise FacilitatorUnsupported(str(exc)) from None
            _facilitator = FacilitatorClient(
                base_url=settings.X402_FACILITATOR_URL,
                timeout=settings.X402_FACILITATOR_TIMEOUT,
                auth=auth,
            )
            _facilitator_built_from = built_from
        return _facilitator
