"""RFC 9457 problem details for the storefront API, and the DRF exception handler.

Every refusal the API gives is a problem document with a stable `code`, the purchase and
operation it concerns and a `next_action` an agent can follow literally. Nothing from an
exception's internals (stack traces, provider payloads, keys) reaches a response: only the
fields built here.
"""

from __future__ import annotations

import logging
import math

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response

from ..enums import Owner, RetryAdvice
from ..errors import DomainError, ErrorCode  # the core owns the refusal type

logger = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_PREFIX = "urn:verity:problem:"

# Members of a problem document a DomainError's `extra` may never overwrite.
_RESERVED = frozenset(
    {"type", "title", "status", "detail", "code", "purchase", "operation", "next_action"}
)

_TITLES = {
    400: "Bad request",
    401: "Unauthenticated",
    402: "Payment declined",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    406: "Not acceptable",
    409: "Conflict",
    415: "Unsupported media type",
    422: "Unprocessable request",
    429: "Too many requests",
    500: "Internal error",
    503: "Service unavailable",
}
# A code whose status's title would say the wrong thing: the x402 deliverable's first 402
# is the expected start of a purchase (no payment was tried), not a decline.
_CODE_TITLES: dict[str, str] = {
    ErrorCode.PAYMENT_REQUIRED: "Payment required",
}


class Problem(Exception):
    """A refusal raised by the API layer itself (auth, idempotency, validation, lookups)."""

    def __init__(
        self,
        *,
        code: str,
        detail: str,
        status: int,
        retry: str = RetryAdvice.FORBIDDEN,
        owner: str = Owner.BUYER,
        purchase: str | None = None,
        operation: str | None = None,
        action_message: str | None = None,
        headers: dict | None = None,
        extra: dict | None = None,
    ) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.status = status
        self.retry = retry
        self.owner = owner
        self.purchase = purchase
        self.operation = operation
        self.action_message = action_message or detail
        self.headers = headers or {}
        self.extra = extra or {}


def problem_body(
    *,
    code: str,
    detail: str,
    status: int,
    retry: str,
    owner: str,
    purchase: str | None = None,
    operation: str | None = None,
    action_message: str | None = None,
    extra: dict | None = None,
) -> dict:
    body = {
        "type": f"{PROBLEM_TYPE_PREFIX}{code}",
        "title": _CODE_TITLES.get(code) or _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
        "purchase": purchase,
        "operation": operation,
        "next_action": {
            "owner": str(owner),
            "retry": str(retry),
            "code": code,
            "message": action_message or detail,
        },
    }
    for key, value in (extra or {}).items():
        if key not in _RESERVED:
            body[key] = value
    return body


def problem_response(problem: Problem) -> Response:
    body = problem_body(
        code=problem.code,
        detail=problem.detail,
        status=problem.status,
        retry=problem.retry,
        owner=problem.owner,
        purchase=problem.purchase,
        operation=problem.operation,
        action_message=problem.action_message,
        extra=problem.extra,
    )
    return Response(
        body, status=problem.status, headers=problem.headers, content_type=PROBLEM_CONTENT_TYPE
    )


def problem_from_domain_error(exc) -> Problem:
    """payments.errors.DomainError -> Problem (codes and advice are the core's)."""
    headers = {}
    extra = dict(exc.extra or {})
    retry_after = extra.pop("retry_after", None)
    if exc.status == 503 or retry_after is not None:
        headers["Retry-After"] = str(int(retry_after or 30))
    # A refusal that says what to do in its own words (payments.keyed's key refusals).
    action = extra.pop("action_message", None) or exc.message
    if exc.operation:
        # Point at the one resource whose state settles the question.
        action = f"{action} Its current state: GET /api/v1/operations/{exc.operation}."
    return Problem(
        code=exc.code,
        detail=exc.message,
        status=exc.status,
        retry=exc.retry,
        owner=exc.owner,
        purchase=exc.purchase,
        operation=exc.operation,
        action_message=action,
        headers=headers,
        extra=_json_safe(extra),
    )


def _json_safe(extra: dict) -> dict:
    out = {}
    for key, value in extra.items():
        if isinstance(value, (str, int, float, bool, type(None), list, dict)):
            out[str(key)] = value
        else:
            out[str(key)] = str(value)
    return out


def _flatten_errors(detail) -> dict:
    """DRF validation detail -> {"field.path": ["message", ...]} (messages only)."""
    out: dict[str, list[str]] = {}

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, int):  # ListSerializer errors are keyed by index
                    walk(value, f"{path}[{key}]")
                else:
                    walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, list):
            if all(not isinstance(item, (dict, list)) for item in node):
                out.setdefault(path or "body", []).extend(str(item) for item in node)
            else:
                for index, item in enumerate(node):
                    walk(item, f"{path}[{index}]")
        else:
            out.setdefault(path or "body", []).append(str(node))

    walk(detail, "")
    return out


# While PostgreSQL is unreachable (a restart, a failover) nothing can have been recorded
# or bound: a 503 that says when to come back, not a 500 that looks like a bug.
DATABASE_UNAVAILABLE_RETRY_AFTER = 5


def database_unavailable_problem() -> Problem:
    wait = DATABASE_UNAVAILABLE_RETRY_AFTER
    return Problem(
        code=ErrorCode.DATABASE_UNAVAILABLE,
        status=503,
        retry=RetryAdvice.SAME_KEY,
        owner=Owner.SUPPORT,
        detail="The service's database is briefly unavailable.",
        action_message=f"Wait {wait} s, then send the same request with the same Idempotency-Key.",
        headers={"Retry-After": str(wait)},
    )


def is_database_unavailable(exc: BaseException) -> bool:
    from django.db import InterfaceError, OperationalError

    return isinstance(exc, (OperationalError, InterfaceError))


def exception_handler(exc, context):
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: every error becomes a problem document."""
    from django.core.exceptions import RequestDataTooBig

    if isinstance(exc, Problem):
        return problem_response(exc)
    if isinstance(exc, DomainError):
        return problem_response(problem_from_domain_error(exc))
    if isinstance(exc, Http404) or isinstance(exc, drf.NotFound):
        return problem_response(
            Problem(
                code=ErrorCode.NOT_FOUND,
                status=404,
                detail="No such resource for this API client.",
                owner=Owner.BUYER,
            )
        )
    if isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        return problem_response(
            Problem(
                code=ErrorCode.UNAUTHENTICATED,
                status=401,
                detail="Send a valid key as 'Authorization: Api-Key <key>'.",
                headers={"WWW-Authenticate": 'Api-Key realm="api"'},
            )
        )
    if isinstance(exc, (drf.PermissionDenied, DjangoPermissionDenied)):
        detail = str(getattr(exc, "detail", "")) or "This API key lacks the scope required."
        return problem_response(
            Problem(code=ErrorCode.FORBIDDEN_SCOPE, status=403, detail=detail, owner=Owner.SUPPORT)
        )
    if isinstance(exc, drf.ValidationError):
        return problem_response(
            Problem(
                code=ErrorCode.INVALID_REQUEST,
                status=400,
                detail="The request body is not valid; see `errors`.",
                action_message="Fix the request and send it again.",
                extra={"errors": _flatten_errors(exc.detail)},
            )
        )
    if isinstance(exc, RequestDataTooBig):
        return problem_response(
            Problem(
                code=ErrorCode.REQUEST_TOO_LARGE,
                status=413,
                detail="The request body is larger than this API accepts.",
                action_message="Send a smaller body; nothing was done.",
            )
        )
    if isinstance(exc, drf.ParseError):
        return problem_response(
            Problem(
                code=ErrorCode.INVALID_REQUEST,
                status=400,
                detail="The request body is not valid JSON.",
            )
        )
    if isinstance(exc, drf.UnsupportedMediaType):
        return problem_response(
            Problem(
                code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                status=415,
                detail="Send the body as application/json.",
            )
        )
    if isinstance(exc, drf.MethodNotAllowed):
        return problem_response(
            Problem(
                code=ErrorCode.METHOD_NOT_ALLOWED,
                status=405,
                detail="This method is not allowed here.",
            )
        )
    if isinstance(exc, drf.NotAcceptable):
        return problem_response(
            Problem(
                code=ErrorCode.NOT_ACCEPTABLE, status=406, detail="Responses are application/json."
            )
        )
    if isinstance(exc, drf.Throttled):
        wait = max(1, math.ceil(exc.wait or 1))
        return problem_response(
            Problem(
                code=ErrorCode.RATE_LIMITED,
                status=429,
                retry=RetryAdvice.SAME_KEY,
                detail=f"Too many requests for this API client; wait {wait} s.",
                action_message=f"Wait {wait} s, then send the same request with the same "
                "Idempotency-Key.",
                headers={"Retry-After": str(wait)},
            )
        )
    if isinstance(exc, drf.APIException):
        return problem_response(
            Problem(
                code=ErrorCode.INVALID_REQUEST,
                status=exc.status_code,
                detail="The request could not be processed.",
            )
        )
    if is_database_unavailable(exc):
        logger.warning(
            "database unavailable in %s: %s",
            context.get("view").__class__.__name__,
            type(exc).__name__,
        )
        return problem_response(database_unavailable_problem())
    # Anything else is a bug: log it with its traceback, answer without internals. The
    # idempotency record (if any) keeps its lease, so the same key resumes the request.
    logger.exception("unhandled error in %s", context.get("view").__class__.__name__)
    return problem_response(
        Problem(
            code=ErrorCode.INTERNAL_ERROR,
            status=500,
            retry=RetryAdvice.SAME_KEY,
            owner=Owner.SUPPORT,
            detail="An internal error occurred; nothing about it is shown here.",
            action_message="Send the same request with the same Idempotency-Key after the "
            "Retry-After delay; it resumes rather than repeats.",
            headers={"Retry-After": "30"},
        )
    )
