"""The five ACP checkout-session endpoints (`/acp/checkout_sessions…`).

`Authorization: Bearer <Verity API key>` with the `acp` scope; `API-Version` required and
checked; `Signature` + `Timestamp` verified when the platform has a signing secret;
`Request-Id` and `Idempotency-Key` echoed; every POST under the core's keyed ladder
(payments.keyed, scoped to client + route) with the ACP's own replay rules (RFC §6):
replay -> the answer the first request gave, stored with the key (same status, same body)
and `Idempotent-Replayed: true`; a 5xx answer is not stored (the same key is processed
afresh); another body -> 422 `idempotency_conflict`; still running -> 409
`idempotency_in_flight` + Retry-After. Every refusal is an ACP `Error`.

`complete` is the one money path: it opens at most one purchase (services.purchase_open,
channel acp) and one payment operation (services.payment_create) in one transaction with
the key's binding, then dispatches it with no transaction open, exactly as the REST API.
A session whose payment is queued, unknown or succeeded answers its current state to any
further complete, whatever the key: never a second charge.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import APIView

from payments.api.authentication import ApiClientRateThrottle, ApiKeyAuthentication, HasScope
from payments.api.idempotency import key_from_headers
from payments.api.problems import DATABASE_UNAVAILABLE_RETRY_AFTER, Problem, is_database_unavailable
from payments.enums import Outcome, Reason
from payments.errors import DomainError, ErrorCode
from payments.keyed import HEADER as IDEMPOTENCY_HEADER
from payments.keyed import REPLAYED_HEADER, Answer, Keyed, KeyedRequest, canonical_json
from payments.models import PaymentOperation

from . import services, sessions
from .errors import AcpError, from_domain_error, from_drf, from_problem
from .models import AgentPlatform, CheckoutSession
from .sessions import Status
from .spec import SUPPORTED_VERSIONS, request_errors

logger = logging.getLogger(__name__)

SCOPE = "acp"


class AcpBearerAuthentication(ApiKeyAuthentication):
    """The ACP's `Authorization: Bearer <key>`: the same API keys, failure throttling and
    revocation as `Api-Key`, under the scheme the protocol names."""

    keyword = "Bearer"

    def authenticate_header(self, request):
        return 'Bearer realm="acp"'


def _validated(schema: str, body) -> dict:
    errors = request_errors(schema, body)
    if errors:
        code, param, message = errors[0]
        raise AcpError(status=400, code=code, param=param, message=message)
    nul = _nul_path(body, "$")
    if nul:
        # PostgreSQL text and jsonb cannot hold NUL: refused here, not a 500 at the save.
        raise AcpError(
            status=400,
            code=ErrorCode.INVALID,
            param=nul,
            message=f"{nul} contains a NUL character.",
        )
    currency = body.get("currency") if isinstance(body, dict) else None
    if currency is not None and not (
        len(currency) == 3 and currency.isascii() and currency.isalpha()
    ):
        raise AcpError(
            status=400,
            code=ErrorCode.INVALID,
            param="$.currency",
            message="currency must be an ISO 4217 code (three letters).",
        )
    return body


def _nul_path(value, path: str) -> str:
    if isinstance(value, str):
        return path if "\x00" in value else ""
    if isinstance(value, dict):
        for key, item in value.items():
            found = _nul_path(key, path) or _nul_path(item, f"{path}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _nul_path(item, f"{path}[{index}]")
            if found:
                return found
    return ""


def _session_or_404(request, session_id: str) -> CheckoutSession:
    session = sessions.session_for_client(session_id, request.auth)
    if session is None:
        raise AcpError(status=404, code=ErrorCode.NOT_FOUND, message="No such checkout session.")
    return session


def _fresh(session_id: str) -> CheckoutSession:
    return CheckoutSession.objects.select_related("purchase__quote", "quote").get(pk=session_id)


SIGNATURE_SKEW_SECONDS = 300


def request_signature(secret: str, timestamp: str, body) -> str:
    """base64url(HMAC-SHA256(secret, "<Timestamp>.<canonical JSON of the body>")), the
    body as parsed (keys sorted, no whitespace: payments.api.idempotency.canonical_json; ""
    when there is none)."""
    payload = canonical_json(body) if body not in (None, {}, "") else ""
    digest = hmac.new(secret.encode(), f"{timestamp}.{payload}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")


def _verify_signature(request) -> None:
    """Only for a platform with a signing secret: then a request without a valid,
    fresh signature is refused before anything is read or written."""
    platform = AgentPlatform.objects.filter(api_client=request.auth).first()
    secret = platform.current_signing_secret() if platform is not None else ""
    if not secret:
        return
    signature = (request.headers.get("Signature") or "").strip().rstrip("=")
    timestamp = (request.headers.get("Timestamp") or "").strip()
    when = parse_datetime(timestamp) if timestamp else None
    if not signature or when is None or when.tzinfo is None:
        raise AcpError(
            status=401,
            code=ErrorCode.INVALID_SIGNATURE,
            param="Signature",
            message="This platform signs its requests: send Signature and an RFC 3339 Timestamp.",
        )
    if abs((timezone.now() - when).total_seconds()) > SIGNATURE_SKEW_SECONDS:
        raise AcpError(
            status=401,
            code=ErrorCode.INVALID_SIGNATURE,
            param="Timestamp",
            message="The request's Timestamp is too far from now.",
        )
    body = request.data if request.method == "POST" else None
    expected = request_signature(secret, timestamp, body)
    if not hmac.compare_digest(signature, expected):
        raise AcpError(
            status=401,
            code=ErrorCode.INVALID_SIGNATURE,
            param="Signature",
            message="The request signature does not match.",
        )


class AcpView(APIView):
    authentication_classes = [AcpBearerAuthentication]
    permission_classes = [HasScope]
    throttle_classes = [ApiClientRateThrottle]
    required_scopes = {"GET": SCOPE, "POST": SCOPE}
    # Not in Verity's own /api/schema/: the protocol's document is acp/spec/ (patched copy).
    schema = None

    def initial(self, request, *args, **kwargs):
        if any("\x00" in str(v) for v in kwargs.values()):
            raise AcpError(
                status=404, code=ErrorCode.NOT_FOUND, message="No such checkout session."
            )
        super().initial(request, *args, **kwargs)  # authentication, scope, throttle
        version = (request.headers.get("API-Version") or "").strip()
        if not version:
            raise AcpError(
                status=400,
                code=ErrorCode.MISSING_API_VERSION,
                param="API-Version",
                message="Send an API-Version header; supported: "
                + ", ".join(SUPPORTED_VERSIONS)
                + ".",
            )
        if version not in SUPPORTED_VERSIONS:
            raise AcpError(
                status=400,
                code=ErrorCode.UNSUPPORTED_API_VERSION,
                param="API-Version",
                message="Unsupported API-Version; supported: "
                + ", ".join(SUPPORTED_VERSIONS)
                + ".",
            )
        _verify_signature(request)

    def handle_exception(self, exc):
        err = acp_error(exc)
        if err is None:
            logger.exception("acp request failed")
            err = AcpError(
                status=500,
                code=ErrorCode.INTERNAL_ERROR,
                message="Something failed on our side; retry with the same Idempotency-Key.",
            )
        return err.response()

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        request_id = request.headers.get("Request-Id", "")
        if request_id and len(request_id) <= 255 and request_id.isprintable():
            response["Request-Id"] = request_id
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        if request.method == "POST" and key and len(key) <= 255 and key.isprintable():
            response[IDEMPOTENCY_HEADER] = key
        response.setdefault("Cache-Control", "no-store")
        return response

    # -- one keyed request: the core's ladder (payments.keyed), rendered as ACP ----------
    @staticmethod
    def keyed(request, *, route: str, body, run, render) -> Response:
        """Run the keyed request and answer it. `render(keyed) -> Answer` is the answer to
        a request that ran; the ladder stores it (or the refusal raised, as an ACP Error)
        with the key, and a replay answers the stored one unchanged (RFC §6.3)."""

        def answer(outcome) -> Answer | None:
            if isinstance(outcome, Exception):
                err = acp_error(outcome)
                return None if err is None else err.answer()
            return render(outcome)

        keyed = run(
            KeyedRequest(
                api_client=request.auth,
                route=route,
                key=key_from_headers(request.headers),
                path=request.path,
                body=body,
            ),
            answer=answer,
        )
        # A replay of a key stored before answers were (none stored): its current state.
        done = keyed.answer if keyed.answer is not None else render(keyed)
        response = Response(done.body, status=done.status, headers=done.headers)
        if keyed.replayed:
            response[REPLAYED_HEADER] = "true"
        return response


def acp_error(exc: BaseException) -> AcpError | None:
    """Any refusal as the spec's Error; None for a crash (the caller answers 500)."""
    if isinstance(exc, AcpError):
        return exc
    if isinstance(exc, Problem):
        return from_problem(exc)
    if isinstance(exc, DomainError):
        return from_domain_error(exc)
    if isinstance(exc, Http404):
        return AcpError(status=404, code=ErrorCode.NOT_FOUND, message="Not found.")
    if isinstance(exc, RequestDataTooBig):
        return AcpError(
            status=413,
            code=ErrorCode.REQUEST_TOO_LARGE,
            message="The request body is larger than this API accepts; nothing "
            "was done. Send a smaller body.",
        )
    if isinstance(exc, drf.APIException):
        return from_drf(exc)
    if is_database_unavailable(exc):
        wait = DATABASE_UNAVAILABLE_RETRY_AFTER
        return AcpError(
            status=503,
            code=ErrorCode.DATABASE_UNAVAILABLE,
            headers={"Retry-After": str(wait)},
            message=f"The service's database is briefly unavailable; retry with "
            f"the same Idempotency-Key after {wait} s.",
        )
    return None


def _session_render(status: int):
    def render(keyed: Keyed) -> Answer:
        return Answer(status, sessions.session_view(_fresh(keyed.resource_id)))

    return render


class SessionCreateApi(AcpView):
    def post(self, request):
        key_from_headers(request.headers)
        data = _validated("CheckoutSessionCreateRequest", request.data)
        return self.keyed(
            request,
            route="acp_checkout_sessions_create",
            body=request.data,
            run=lambda keyed_request, **kw: services.session_create(keyed_request, data=data, **kw),
            render=_session_render(201),
        )


class SessionApi(AcpView):
    def get(self, request, session_id: str):
        return Response(sessions.session_view(_session_or_404(request, session_id)))

    def post(self, request, session_id: str):
        key_from_headers(request.headers)
        session = _session_or_404(request, session_id)
        data = _validated("CheckoutSessionUpdateRequest", request.data)
        return self.keyed(
            request,
            route="acp_checkout_sessions_update",
            body=request.data,
            run=lambda keyed_request, **kw: services.session_update(
                keyed_request, session_id=session.id, data=data, **kw
            ),
            render=_session_render(200),
        )


def _payment_token(payment_data: dict) -> str:
    """The delegated Stripe shared payment token, in either form the (patched) spec allows."""
    if "token" in payment_data or "provider" in payment_data:
        token = payment_data.get("token", "")
    else:
        instrument = payment_data.get("instrument") or {}
        token = (instrument.get("credential") or {}).get("token", "")
        if payment_data.get("handler_id") != sessions.HANDLER["id"]:
            raise AcpError(
                status=400,
                code=ErrorCode.INVALID,
                param="$.payment_data.handler_id",
                message=f"Unknown payment handler; use {sessions.HANDLER['id']!r}.",
            )
    if not isinstance(token, str) or not token.startswith("spt_"):
        raise AcpError(
            status=400,
            code=ErrorCode.INVALID,
            param="$.payment_data",
            message="payment_data must carry a Stripe shared payment token (spt_…).",
        )
    return token


def _complete_answer(keyed: Keyed) -> Answer:
    """The truth about a completed-or-trying session: 200 with the order once the provider's
    success is recorded; 202 `complete_in_progress` + Retry-After while it is not known;
    the payment's refusal as an Error when it failed."""
    session = _fresh(keyed.resource_id)
    view = sessions.session_view(session)
    if view["status"] == Status.COMPLETED:
        return Answer(200, view)
    if view["status"] == Status.IN_PROGRESS:
        return Answer(202, view, {"Retry-After": str(sessions.IN_PROGRESS_RETRY_AFTER)})
    op = sessions.payment_op(session.purchase)
    if op is not None and op.outcome == Outcome.FAILED:
        return _payment_failed(op).answer()
    return AcpError(
        status=409,
        code=ErrorCode.SESSION_NOT_COMPLETABLE,
        message=f"This session is {view['status']}; it cannot be completed.",
    ).answer()


def _payment_failed(op: PaymentOperation) -> AcpError:
    """A payment that provably moved no money, said as the spec's Error."""
    after = "; no money moved. Complete again with a new Idempotency-Key."
    if sessions.attempts_exhausted(op.purchase_id):
        # Never an invitation the server would refuse (the session says so too).
        after = (
            "; no money moved. That was this session's last payment attempt: it "
            "cannot be paid any more, and our support will contact the buyer."
        )
    if op.reason == Reason.CARD_DECLINED:
        return AcpError(
            status=402,
            code=ErrorCode.PAYMENT_DECLINED,
            param="$.payment_data",
            message="The card was declined" + after,
        )
    if op.reason == Reason.PROVIDER_UNREACHABLE:
        return AcpError(
            status=503,
            code=ErrorCode.PROVIDER_UNAVAILABLE,
            headers={"Retry-After": "30"},
            message="The payment provider could not be reached" + after,
        )
    if op.reason == Reason.INVALID_REQUEST:
        return AcpError(
            status=400,
            code=ErrorCode.PAYMENT_DECLINED,
            param="$.payment_data",
            message="The provider refused the payment token (used, expired, or "
            "not valid for this amount or currency)"
            + after
            + " Ask the agent platform for a new token.",
        )
    return AcpError(
        status=402,
        code=ErrorCode.PAYMENT_DECLINED,
        param="$.payment_data",
        message="The payment failed" + after,
    )


class SessionCompleteApi(AcpView):
    def post(self, request, session_id: str):
        key_from_headers(request.headers)
        session = _session_or_404(request, session_id)
        data = _validated("CheckoutSessionCompleteRequest", request.data)
        token = _payment_token(data["payment_data"])
        return self.keyed(
            request,
            route="acp_checkout_sessions_complete",
            body=request.data,
            run=lambda keyed_request, **kw: services.session_complete(
                keyed_request, session_id=session.id, data=data, token=token, **kw
            ),
            render=_complete_answer,
        )


class SessionCancelApi(AcpView):
    def post(self, request, session_id: str):
        key_from_headers(request.headers)
        session = _session_or_404(request, session_id)
        body = request.data if request.data else {}
        _validated("CancelSessionRequest", body)
        return self.keyed(
            request,
            route="acp_checkout_sessions_cancel",
            body=body,
            run=lambda keyed_request, **kw: services.session_cancel(
                keyed_request, session_id=session.id, **kw
            ),
            render=_session_render(200),
        )


class UnknownApi(AcpView):
    """No such ACP operation: the spec's Error (after the same doors as the others)."""

    def _unknown(self, request, *args, **kwargs):
        raise AcpError(
            status=404,
            code=ErrorCode.NOT_FOUND,
            message="No such ACP operation; see the checkout API's five.",
        )

    get = post = put = patch = delete = _unknown
