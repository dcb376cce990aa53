"""The REST face of the `Idempotency-Key` contract (see
docs/walkthrough.md#api-rules-the-code-relies-on): reading the key from the headers and a
replay's body. The contract itself — claim, replay, take-over, fenced binding, complete or
release — is the core's, once for every face: payments.keyed. The old names stay here for
callers outside the faces (their refusals as problem documents).
"""

from __future__ import annotations

from django.conf import settings

from ..enums import RetryAdvice
from ..errors import DomainError, ErrorCode
from ..keyed import (
    _REPLAYED_OPERATION,  # noqa: F401 - tests read its compiled statement
    HEADER,
    MAX_KEY_LENGTH,
    REPLAYED_HEADER,
    Claim,
    canonical_json,
    key_bind,
    key_claim,
    key_complete,
    key_release,
    key_replay_of,
    key_replayed_operation,
    request_fingerprint,
)
from ..models import ApiClient
from .problems import Problem, problem_from_domain_error


def key_from_headers(headers) -> str:
    key = (headers.get(HEADER) or "").strip()
    if not key:
        raise Problem(
            code=ErrorCode.IDEMPOTENCY_KEY_REQUIRED,
            status=400,
            retry=RetryAdvice.SAME_KEY,
            detail=f"This request creates an effect: send an {HEADER} header (a unique "
            "value per intended effect, reused only to retry that same request).",
            action_message=f"Generate one {HEADER} for this intent, send it, and reuse it "
            "only when retrying this exact request.",
        )
    if len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise Problem(
            code=ErrorCode.INVALID_REQUEST,
            status=400,
            detail=f"{HEADER} must be 1-{MAX_KEY_LENGTH} printable characters.",
        )
    return key


def _as_problem(exc: DomainError) -> Problem:
    return problem_from_domain_error(exc)


def idempotency_claim(*, api_client: ApiClient, route: str, key: str, path: str, body) -> Claim:
    """payments.keyed.key_claim, its refusals as problems (the faces use keyed_effect)."""
    try:
        return key_claim(api_client=api_client, route=route, key=key, path=path, body=body)
    except DomainError as exc:
        raise _as_problem(exc) from None


def idempotency_bind(claim: Claim, *, resource_type: str, resource_id: str) -> None:
    try:
        key_bind(claim, resource_type=resource_type, resource_id=resource_id)
    except DomainError as exc:
        raise _as_problem(exc) from None


# Set on a request whose replay the fast path already asked after (the record and its
# operation, one statement) and found none: the view does not ask again.
NOT_A_REPLAY = "_verity_not_a_replay"

idempotency_complete = key_complete
idempotency_release = key_release
idempotency_replay_of = key_replay_of
idempotency_replayed_operation = key_replayed_operation


def replay_body(request):
    """The request's JSON body parsed exactly as the DRF view would (same parser, same
    media type rule), or None when it would not parse — without touching the DRF request,
    so a body that is no replay meets the unchanged view and its unchanged errors."""
    from io import BytesIO

    from rest_framework.parsers import JSONParser

    from .parsers import BoundedJSONParser

    http = getattr(request, "_request", request)  # a DRF Request wraps the HttpRequest
    media = (http.META.get("CONTENT_TYPE") or "").split(";")[0].strip()
    if media != JSONParser.media_type:
        return None
    try:
        # The parser context DRF's Request gives (its encoding rule included).
        context = {"request": http, "encoding": http.encoding or settings.DEFAULT_CHARSET}
        return BoundedJSONParser().parse(BytesIO(http.body), media, context)
    except Exception:  # noqa: BLE001 - any refusal is the view's to answer
        return None


__all__ = [
    "HEADER",
    "NOT_A_REPLAY",
    "REPLAYED_HEADER",
    "Claim",
    "canonical_json",
    "idempotency_bind",
    "idempotency_claim",
    "idempotency_complete",
    "idempotency_release",
    "idempotency_replay_of",
    "idempotency_replayed_operation",
    "key_from_headers",
    "replay_body",
    "request_fingerprint",
]
