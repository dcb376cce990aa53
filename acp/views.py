"""The five ACP checkout-session endpoints (`/acp/checkout_sessions…`).

`Authorization: Bearer <Verity API key>` with the `acp` scope; `API-Version` required and
checked; `Signature` + `Timestamp` verified when the platform has a signing secret;
`Request-Id` and `Idempotency-Key` echoed; every POST under the same
Idempotency-Key contract as the REST API (payments.api.idempotency, scoped to client + route):
replay -> the session's current state with `Idempotent-Replayed: true`, another body ->
422 `idempotency_conflict`, still running -> 409 `idempotency_in_flight` + Retry-After.

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

from django.db import transaction
from django.http import Http404
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import APIView

from payments import services
from payments.api.authentication import ApiClientRateThrottle, ApiKeyAuthentication, HasScope
from payments.enums import Outcome, Reason
from payments.errors import DomainError
from payments.api.idempotency import (
    HEADER as IDEMPOTENCY_HEADER,
    REPLAYED_HEADER,
    canonical_json,
    idempotency_bind,
    idempotency_claim,
    idempotency_complete,
    idempotency_release,
    key_from_headers,
)
from payments.locks import assert_outside_transaction
from payments.models import PaymentOperation, PurchaseChannel
from payments.api.problems import Problem

from . import sessions
from .errors import AcpError, from_domain_error, from_drf, from_problem
from .models import AgentPlatform, CheckoutSession
from .sessions import Status
from .spec import SUPPORTED_VERSIONS, request_errors

logger = logging.getLogger(__name__)

SCOPE = "acp"
RESOURCE = "acp_session"


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
        raise AcpError(status=400, code="invalid", param=nul,
                       message=f"{nul} contains a NUL character.")
    currency = body.get("currency") if isinstance(body, dict) else None
    if currency is not None and not (len(currency) == 3 and currency.isascii()
                                     and currency.isalpha()):
        raise AcpError(status=400, code="invalid", param="$.currency",
                       message="currency must be an ISO 4217 code (three letters).")
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
        raise AcpError(status=404, code="not_found", message="No such checkout session.")
    return session


def _locked(session_id: str) -> CheckoutSession:
    return CheckoutSession.objects.select_for_update().get(pk=session_id)


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
    if platform is None or not platform.signing_secret:
        return
    signature = (request.headers.get("Signature") or "").strip().rstrip("=")
    timestamp = (request.headers.get("Timestamp") or "").strip()
    when = parse_datetime(timestamp) if timestamp else None
    if not signature or when is None or when.tzinfo is None:
        raise AcpError(status=401, code="invalid_signature", param="Signature",
                       message="This platform signs its requests: send Signature and an "
                               "RFC 3339 Timestamp.")
    if abs((timezone.now() - when).total_seconds()) > SIGNATURE_SKEW_SECONDS:
        raise AcpError(status=401, code="invalid_signature", param="Timestamp",
                       message="The request's Timestamp is too far from now.")
    body = request.data if request.method == "POST" else None
    expected = request_signature(platform.signing_secret, timestamp, body)
    if not hmac.compare_digest(signature, expected):
        raise AcpError(status=401, code="invalid_signature", param="Signature",
                       message="The request signature does not match.")


class AcpView(APIView):
    authentication_classes = [AcpBearerAuthentication]
    permission_classes = [HasScope]
    throttle_classes = [ApiClientRateThrottle]
    required_scopes = {"GET": SCOPE, "POST": SCOPE}
    # Not in Verity's own /api/schema/: the protocol's document is acp/spec/ (patched copy).
    schema = None

    def initial(self, request, *args, **kwargs):
        if any("\x00" in str(v) for v in kwargs.values()):
            raise AcpError(status=404, code="not_found", message="No such checkout session.")
        super().initial(request, *args, **kwargs)  # authentication, scope, throttle
        version = (request.headers.get("API-Version") or "").strip()
        if not version:
            raise AcpError(status=400, code="missing_api_version", param="API-Version",
                           message="Send an API-Version header; supported: "
                                   + ", ".join(SUPPORTED_VERSIONS) + ".")
        if version not in SUPPORTED_VERSIONS:
            raise AcpError(status=400, code="unsupported_api_version", param="API-Version",
                           message="Unsupported API-Version; supported: "
                                   + ", ".join(SUPPORTED_VERSIONS) + ".")
        _verify_signature(request)

    def handle_exception(self, exc):
        if isinstance(exc, AcpError):
            err = exc
        elif isinstance(exc, Problem):
            err = from_problem(exc)
        elif isinstance(exc, DomainError):
            err = from_domain_error(exc)
        elif isinstance(exc, Http404):
            err = AcpError(status=404, code="not_found", message="Not found.")
        elif isinstance(exc, drf.APIException):
            err = from_drf(exc)
        else:
            logger.exception("acp request failed")
            err = AcpError(status=500, code="internal_error",
                           message="Something failed on our side; retry with the same "
                                   "Idempotency-Key.")
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

    # -- the Idempotency-Key contract around one effect -------------------------------
    def idempotent(self, request, *, route: str, body, effect, replay) -> Response:
        key = key_from_headers(request.headers)
        claim = idempotency_claim(api_client=request.auth, route=route, key=key,
                                  path=request.path, body=body)
        if claim.replay:
            response = replay(claim)
            response[REPLAYED_HEADER] = "true"
            return response
        try:
            return effect(claim)
        except (AcpError, DomainError, Problem) as exc:
            if claim.resource_id:
                # The effect exists: the key stays bound to it; a replay shows its state.
                idempotency_complete(claim, status=exc.status)
            else:
                idempotency_release(claim)  # refused before any effect: key stays free
            raise
        except Exception:
            if not claim.resource_id:
                idempotency_release(claim)
            raise


def _session_response(session_id: str, status: int) -> Response:
    return Response(sessions.session_view(_fresh(session_id)), status=status)


class SessionCreateApi(AcpView):
    def post(self, request):
        key_from_headers(request.headers)
        data = _validated("CheckoutSessionCreateRequest", request.data)

        def effect(claim):
            with transaction.atomic():
                session = CheckoutSession(
                    api_client=request.auth, currency=data["currency"].lower(),
                    items=sessions.normalise_items(data["line_items"]),
                    buyer=data.get("buyer"),
                    fulfillment_details=data.get("fulfillment_details"))
                sessions.reprice(session)
                session.save()
                idempotency_bind(claim, resource_type=RESOURCE, resource_id=session.id)
            idempotency_complete(claim, status=201)
            return _session_response(session.id, 201)

        return self.idempotent(
            request, route="acp_checkout_sessions_create", body=request.data, effect=effect,
            replay=lambda claim: _session_response(claim.resource_id, 201))


class SessionApi(AcpView):
    def get(self, request, session_id: str):
        return Response(sessions.session_view(_session_or_404(request, session_id)))

    def post(self, request, session_id: str):
        key_from_headers(request.headers)
        session = _session_or_404(request, session_id)
        data = _validated("CheckoutSessionUpdateRequest", request.data)

        def effect(claim):
            with transaction.atomic():
                s = _locked(session.id)
                if s.purchase_id is not None or s.canceled_at is not None:
                    raise AcpError(status=409, code="session_not_updatable",
                                   message="This session is "
                                           f"{sessions.session_status(_fresh(s.id))}; it can "
                                           "no longer be changed.")
                if "line_items" in data:
                    s.items = sessions.normalise_items(data["line_items"])
                if "buyer" in data:
                    s.buyer = data["buyer"]
                if "fulfillment_details" in data:
                    s.fulfillment_details = data["fulfillment_details"]
                if "selected_fulfillment_options" in data:
                    s.selected_fulfillment_options = _selected_options(
                        s, data["selected_fulfillment_options"])
                # Every update reprices from the catalogue (prices and stock move).
                sessions.reprice(s)
                s.save()
                idempotency_bind(claim, resource_type=RESOURCE, resource_id=s.id)
            idempotency_complete(claim, status=200)
            return _session_response(s.id, 200)

        return self.idempotent(
            request, route="acp_checkout_sessions_update", body=request.data, effect=effect,
            replay=lambda claim: _session_response(claim.resource_id, 200))


def _selected_options(session: CheckoutSession, selected: list[dict]) -> list[dict]:
    offered = {o["id"]: o["type"] for o in sessions.fulfillment_options(
        sessions.products_for(session.items))}
    for index, option in enumerate(selected):
        if offered.get(option["option_id"]) != option["type"]:
            raise AcpError(status=400, code="invalid",
                           param=f"$.selected_fulfillment_options[{index}]",
                           message="No such fulfillment option for this session.")
    return selected


def _payment_token(payment_data: dict) -> str:
    """The delegated Stripe shared payment token, in either form the (patched) spec allows."""
    if "token" in payment_data or "provider" in payment_data:
        token = payment_data.get("token", "")
    else:
        instrument = payment_data.get("instrument") or {}
        token = (instrument.get("credential") or {}).get("token", "")
        if payment_data.get("handler_id") != sessions.HANDLER["id"]:
            raise AcpError(status=400, code="invalid", param="$.payment_data.handler_id",
                           message=f"Unknown payment handler; use {sessions.HANDLER['id']!r}.")
    if not isinstance(token, str) or not token.startswith("spt_"):
        raise AcpError(status=400, code="invalid", param="$.payment_data",
                       message="payment_data must carry a Stripe shared payment token "
                               "(spt_…).")
    return token


def _complete_answer(session_id: str) -> Response:
    """The truth about a completed-or-trying session: 200 with the order once the provider's
    success is recorded; 202 `complete_in_progress` + Retry-After while it is not known;
    the payment's refusal as an Error when it failed."""
    session = _fresh(session_id)
    view = sessions.session_view(session)
    if view["status"] == Status.COMPLETED:
        return Response(view, status=200)
    if view["status"] == Status.IN_PROGRESS:
        return Response(view, status=202,
                        headers={"Retry-After": str(sessions.IN_PROGRESS_RETRY_AFTER)})
    op = sessions.payment_op(session.purchase)
    if op is not None and op.outcome == Outcome.FAILED:
        raise _payment_failed(op)
    raise AcpError(status=409, code="session_not_completable",
                   message=f"This session is {view['status']}; it cannot be completed.")


def _payment_failed(op: PaymentOperation) -> AcpError:
    """A payment that provably moved no money, said as the spec's Error."""
    after = "; no money moved. Complete again with a new Idempotency-Key."
    if op.reason == Reason.CARD_DECLINED:
        return AcpError(status=402, code="payment_declined", param="$.payment_data",
                        message="The card was declined" + after)
    if op.reason == Reason.PROVIDER_UNREACHABLE:
        return AcpError(status=503, code="provider_unavailable",
                        headers={"Retry-After": "30"},
                        message="The payment provider could not be reached" + after)
    if op.reason == Reason.INVALID_REQUEST:
        return AcpError(status=400, code="payment_declined", param="$.payment_data",
                        message="The provider refused the payment token (used, expired, or "
                                "not valid for this amount or currency)" + after
                                + " Ask the agent platform for a new token.")
    return AcpError(status=402, code="payment_declined", param="$.payment_data",
                    message="The payment failed" + after)


class SessionCompleteApi(AcpView):
    def post(self, request, session_id: str):
        key_from_headers(request.headers)
        session = _session_or_404(request, session_id)
        data = _validated("CheckoutSessionCompleteRequest", request.data)
        token = _payment_token(data["payment_data"])
        client = request.auth

        def effect(claim):
            self._requote_if_expired(session.id)
            with transaction.atomic():
                s = _locked(session.id)
                if s.canceled_at is not None:
                    raise AcpError(status=409, code="session_not_completable",
                                   message="This session was canceled.")
                op = sessions.payment_op(s.purchase)
                if op is not None and op.outcome != Outcome.FAILED:
                    # Queued, sent, unknown or succeeded: this complete is not a new payment,
                    # whatever its key; it answers the session's current state.
                    idempotency_bind(claim, resource_type=RESOURCE, resource_id=s.id)
                    op_id = op.id
                else:
                    op_id = self._pay(s, data, token, client, retry_of=op.id if op else None)
                    idempotency_bind(claim, resource_type=RESOURCE, resource_id=s.id)
            # Outside the transaction on purpose: a transaction never waits on the provider.
            assert_outside_transaction()
            if PaymentOperation.objects.filter(pk=op_id, outcome=Outcome.PENDING).exists():
                services.operation_dispatch(operation_id=op_id)
            response = _complete_answer(session.id)
            idempotency_complete(claim, status=response.status_code)
            return response

        return self.idempotent(
            request, route="acp_checkout_sessions_complete", body=request.data, effect=effect,
            replay=lambda claim: _complete_answer(claim.resource_id))

    @staticmethod
    def _requote_if_expired(session_id: str) -> None:
        """A quote lives 30 minutes; an agent may complete later. Reprice first: the same
        amount goes on; another amount is shown to the agent, never charged unseen."""
        with transaction.atomic():
            s = _locked(session_id)
            if s.purchase_id is not None:
                return  # its purchase carries its own (accepted) quote
            if s.quote is None or sessions.item_problems(s):
                raise AcpError(status=409, code="session_not_ready",
                               message="This session is not ready for payment: see its "
                                       "messages.")
            if s.quote.expires_at > timezone.now():
                return
            amount = s.quote.amount
            sessions.reprice(s)
            s.save()
        if s.quote is None or s.quote.amount != amount:
            raise AcpError(status=409, code="price_changed",
                           message="Prices or stock changed since this session was priced; "
                                   "retrieve it and review the new totals.")

    @staticmethod
    def _pay(s: CheckoutSession, data: dict, token: str, client, *, retry_of) -> str:
        buyer = data.get("buyer") or s.buyer or {}
        email = (buyer.get("email") or "").strip()
        if not email:
            raise AcpError(status=400, code="missing", param="$.buyer.email",
                           message="The buyer's email is required to complete.")
        if data.get("buyer"):
            s.buyer = data["buyer"]
        if s.purchase is None:
            # The buyer is the ACP customer: the same guards (an unresolved purchase, the
            # same basket again) apply across sessions as across REST purchases.
            opened = services.purchase_open(
                api_client=client, quote_id=s.quote.id, quote_version=s.quote.version,
                customer_reference=f"acp:{email.lower()}", customer_email=email,
                channel=PurchaseChannel.ACP)
            s.purchase = opened.purchase
        # A retry (retry_of) on a session whose payment failed: payment_create asks the
        # duplicate guard again (the buyer may have bought the same basket elsewhere since).
        op = services.payment_create(
            purchase_id=s.purchase.id, api_client=client, payment_method=token,
            capture_method="automatic", retry_of=retry_of, amount=s.purchase.amount,
            currency=s.purchase.currency)
        s.save()
        return op.id


class SessionCancelApi(AcpView):
    def post(self, request, session_id: str):
        key_from_headers(request.headers)
        session = _session_or_404(request, session_id)
        body = request.data if request.data else {}
        _validated("CancelSessionRequest", body)

        def effect(claim):
            with transaction.atomic():
                s = _locked(session.id)
                status = sessions.session_status(_fresh(s.id))
                if status in (Status.COMPLETED, Status.IN_PROGRESS, Status.CANCELED,
                              Status.EXPIRED):
                    # After payment the refund path stays with people and the REST API.
                    raise AcpError(status=405, code="not_cancelable",
                                   message=f"This session is {status}; it cannot be canceled.")
                if s.purchase_id is not None:
                    try:
                        services.purchase_cancel(purchase_id=s.purchase_id, api_client=client)
                    except DomainError as exc:
                        raise AcpError(status=405, code="not_cancelable",
                                       message=exc.message) from None
                s.canceled_at = timezone.now()
                s.save()
                idempotency_bind(claim, resource_type=RESOURCE, resource_id=s.id)
            idempotency_complete(claim, status=200)
            return _session_response(s.id, 200)

        client = request.auth
        return self.idempotent(
            request, route="acp_checkout_sessions_cancel", body=body, effect=effect,
            replay=lambda claim: _session_response(claim.resource_id, 200))
