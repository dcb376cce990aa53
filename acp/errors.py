"""ACP `Error` answers: {type, code, message, param?} (spec `Error`), from Verity's own
refusals (payments.errors.DomainError, payments.api.problems.Problem) and DRF's."""

from __future__ import annotations

from rest_framework import exceptions as drf
from rest_framework.response import Response

from payments.api.problems import Problem
from payments.errors import DomainError, ErrorCode
from payments.keyed import Answer

# Verity's idempotency codes -> the ACP RFC §6 codes (same rules, the protocol's names).
_IDEMPOTENCY_CODES: dict[str, str] = {
    ErrorCode.IDEMPOTENCY_KEY_REUSED: ErrorCode.IDEMPOTENCY_CONFLICT,
    ErrorCode.REQUEST_IN_PROGRESS: ErrorCode.IDEMPOTENCY_IN_FLIGHT,
    ErrorCode.IDEMPOTENCY_KEY_REQUIRED: ErrorCode.IDEMPOTENCY_KEY_REQUIRED,
}


class AcpError(Exception):
    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        type: str | None = None,
        headers: dict | None = None,
        extra: dict | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.type = type or (
            "service_unavailable"
            if status == 503
            else "processing_error"
            if status >= 500
            else "invalid_request"
        )
        self.headers = headers or {}

    def body(self) -> dict:
        out = {"type": self.type, "code": self.code, "message": self.message}
        if self.param:
            out["param"] = self.param
        return out

    def response(self) -> Response:
        return Response(self.body(), status=self.status, headers=self.headers)

    def answer(self) -> Answer:
        """This refusal as the answer stored with an Idempotency-Key (payments.keyed)."""
        return Answer(self.status, self.body(), dict(self.headers))


def from_problem(exc: Problem) -> AcpError:
    return AcpError(
        status=exc.status,
        code=_IDEMPOTENCY_CODES.get(exc.code, exc.code),
        message=exc.detail,
        headers=exc.headers,
    )


def _guard_message(exc: DomainError) -> str:
    """The buyer guards over ACP. REST and MCP lift them with the code the buyer gets from
    the earlier purchase's status page; the ACP complete request has no field that could
    carry it (every object of the spec is closed), so over ACP the guard cannot be lifted
    and the answer does not promise it can (docs/acp.md#the-buyer-guards)."""
    earlier = exc.purchase or "an earlier purchase"
    if exc.code == ErrorCode.CUSTOMER_HAS_UNRESOLVED_PURCHASE:
        return (
            f"This buyer has purchase {earlier} whose payment is not settled yet; the "
            "provider may have charged the buyer. This session cannot be completed "
            "while it is unsettled: do not pay again, and tell the buyer to follow that "
            "purchase on its status page. A new session is accepted once it is settled."
        )
    never = bool((exc.extra or {}).get("never_twice"))
    return (
        f"This buyer already has purchase {earlier} for the same items and amount. This "
        "session cannot be completed: over this protocol a buyer cannot confirm buying "
        "the same basket again"
        + (
            ", and these items are sold once per buyer."
            if never
            else "; a new session for it is accepted once that purchase neither holds nor "
            "awaits the buyer's money (refunded, cancelled, failed, or its quote "
            "expired unpaid) or once the duplicate window has passed."
        )
        + " Tell the buyer about the earlier order; do not retry "
        "unchanged."
    )


def from_domain_error(exc: DomainError) -> AcpError:
    headers = {}
    message = exc.message
    if exc.code in (
        ErrorCode.PROBABLE_DUPLICATE_PURCHASE,
        ErrorCode.CUSTOMER_HAS_UNRESOLVED_PURCHASE,
    ):
        message = _guard_message(exc)
    retry_after = (exc.extra or {}).get("retry_after")
    if exc.status == 503 or retry_after is not None:
        headers["Retry-After"] = str(int(retry_after or 30))
    return AcpError(
        status=exc.status,
        code=_IDEMPOTENCY_CODES.get(exc.code, exc.code),
        message=message,
        headers=headers,
    )


def from_drf(exc: drf.APIException) -> AcpError:
    headers = {}
    code = {
        drf.NotAuthenticated: ErrorCode.UNAUTHENTICATED,
        drf.AuthenticationFailed: ErrorCode.UNAUTHENTICATED,
        drf.PermissionDenied: ErrorCode.FORBIDDEN_SCOPE,
        drf.Throttled: ErrorCode.RATE_LIMITED,
        drf.ParseError: ErrorCode.INVALID_JSON,
        drf.UnsupportedMediaType: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        drf.MethodNotAllowed: ErrorCode.METHOD_NOT_ALLOWED,
        drf.NotFound: ErrorCode.NOT_FOUND,
        drf.NotAcceptable: ErrorCode.NOT_ACCEPTABLE,
    }.get(type(exc), ErrorCode.INVALID_REQUEST)
    # drf sets Throttled.wait in __init__; its stubs do not declare the attribute.
    wait: float | None = exc.wait if isinstance(exc, drf.Throttled) else None  # type: ignore[attr-defined]
    if wait:
        headers["Retry-After"] = str(max(1, int(wait)))
    if isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        headers["WWW-Authenticate"] = 'Bearer realm="acp"'
    message = str(exc.detail) if isinstance(exc.detail, str) else "Invalid request."
    return AcpError(status=exc.status_code, code=code, message=message, headers=headers)
