"""Storefront REST API (`/api/v1/`): thin views over payments.services, rendered by the
presenter (payments/api/presenters.py).

Views parse, call one service, render a selector's view. None of them is atomic
(ATOMIC_REQUESTS is off): a payment's provider call happens in `operation_dispatch`,
which must run with no transaction open. Each effect is created in a short transaction
together with its idempotency binding, so a crash leaves either nothing or a bound,
resumable resource.
"""

from __future__ import annotations

from collections.abc import Callable

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from recovery.metrics import BLOCKED_DUPLICATES, IDEMPOTENT_REPLAYS
from recovery.selectors import deliverable_for

from .. import selectors, services
from ..enums import PAYMENT_KINDS, OperationKind, Outcome, Owner, RetryAdvice
from ..errors import DomainError, ErrorCode
from ..keyed import (
    REPLAYED_HEADER,
    Created,
    Keyed,
    KeyedRequest,
    key_replay_of,
    keyed_effect,
)
from ..locks import assert_outside_transaction
from ..models import PaymentOperation, Purchase, PurchaseChannel, Quote
from ..services.requests import follow_up_request, payment_request
from ..view_queries import operations_for_view
from . import presenters, x402_views
from .examples import (
    EXAMPLE_ALREADY_PAID,
    EXAMPLE_CHARGE_REQUEST,
    EXAMPLE_DECLINE,
    EXAMPLE_LIMITS,
    EXAMPLE_PRODUCTS,
    EXAMPLE_PURCHASE,
    EXAMPLE_PURCHASE_REQUEST,
    EXAMPLE_QUOTE_REQUEST,
    EXAMPLE_REFUND_REQUEST,
    EXAMPLE_RESOLVE_REQUEST,
    EXAMPLE_RETRY_REQUEST,
    EXAMPLE_REUSED,
    EXAMPLE_SUCCEEDED,
    EXAMPLE_UNKNOWN,
)
from .idempotency import NOT_A_REPLAY, key_from_headers, replay_body
from .lists import (
    PURCHASE_LIST_PARAMETERS,
    PurchaseListOut,
    purchase_list_cursor,
    purchase_list_query,
)
from .problems import PROBLEM_CONTENT_TYPE, Problem, problem_body
from .serializers import (
    DeclineIn,
    DeliverableOut,
    DeliverablePendingOut,
    EmptyIn,
    LimitsOut,
    OperationOut,
    PaymentCreateIn,
    ProblemOut,
    ProductListOut,
    PurchaseCreateIn,
    PurchaseOut,
    QuoteCreateIn,
    QuoteOut,
    RefundCreateIn,
    ResolveIn,
)

READ = "purchases:read"
WRITE = "purchases:write"
REFUNDS = "refunds:write"
RESOLVE = "operations:resolve"

_PAYMENT_KIND_VALUES = [k.value for k in PAYMENT_KINDS]


# -- helpers ------------------------------------------------------------------------


def _unknown_fields(serializer, data, prefix: str = "") -> list[str]:
    """Names in the body the serializer does not declare, nested ones as `items[0].price`."""
    if not isinstance(data, dict):
        return []
    out = []
    for name, value in data.items():
        field = serializer.fields.get(name)
        if field is None or field.read_only:
            out.append(f"{prefix}{name}")
        elif isinstance(field, serializers.ListSerializer) and isinstance(value, list):
            for i, item in enumerate(value[:100]):
                out += _unknown_fields(field.child, item, f"{prefix}{name}[{i}].")
        elif isinstance(field, serializers.Serializer):
            out += _unknown_fields(field, value, f"{prefix}{name}.")
    return out


def _validated(serializer_class, data, *, strict: bool = False) -> dict:
    """Shape validation. `strict` (money requests and quotes,
    docs/walkthrough.md#api-rules-the-code-relies-on): a field Verity does
    not understand is refused, never dropped — an agent that thinks it tipped must learn that
    it did not. Refused before any effect, so the Idempotency-Key is not bound."""
    if strict:
        unknown = _unknown_fields(serializer_class(), data)
        if unknown:
            raise Problem(
                code=ErrorCode.UNKNOWN_FIELD,
                status=400,
                retry=RetryAdvice.NEW_OPERATION,
                detail=f"Unknown field(s): {', '.join(unknown[:10])}. Nothing was "
                "done; send only the documented fields.",
                extra={"fields": unknown[:10]},
            )
    serializer = serializer_class(data=data if data is not None else {})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _not_found(what: str) -> Problem:
    return Problem(
        code=ErrorCode.NOT_FOUND, status=404, detail=f"No such {what} for this API client."
    )


def _purchase_or_404(request, purchase_id: str) -> Purchase:
    purchase = selectors.purchase_get_for_client(purchase_id=purchase_id, api_client=request.auth)
    if purchase is None:
        raise _not_found("purchase")
    return purchase


def _operation_or_404(request, operation_id: str) -> PaymentOperation:
    op = selectors.operation_get_for_client(operation_id=operation_id, api_client=request.auth)
    if op is None:
        raise _not_found("operation")
    return op


def _actor(request) -> str:
    return f"api:{request.auth.name}:{request.auth.prefix}"


def _assert_no_transaction_open() -> None:
    # Provider calls must not sit inside a transaction (row locks held across the network,
    # evidence of a send rolled back); the view is not atomic and says so here.
    assert_outside_transaction()


def _load_operation(operation_id: str) -> PaymentOperation:
    # One statement: the operation view's relations and counts (payments.view_queries).
    return operations_for_view().get(pk=operation_id)


def _render_current(resource_type: str, resource_id: str) -> dict:
    """The resource's *current* state, as a replay must answer."""
    if resource_type == "operation":
        return presenters.operation_view(_load_operation(resource_id))
    if resource_type == "purchase":
        return presenters.purchase_view(
            Purchase.objects.select_related("quote").get(pk=resource_id)
        )
    if resource_type == "quote":
        return presenters.quote_view(Quote.objects.get(pk=resource_id))
    raise ValueError(resource_type)


def _location(resource_type: str, resource_id: str) -> str:
    return {
        "operation": f"/api/v1/operations/{resource_id}",
        "purchase": f"/api/v1/purchases/{resource_id}",
    }[resource_type]


# Refusals that stop a duplicate money movement or a duplicate in-flight request (metrics).
_BLOCKED_DUPLICATE_CODES = frozenset(
    {
        ErrorCode.IDEMPOTENCY_KEY_REUSED,
        ErrorCode.REQUEST_IN_PROGRESS,
        ErrorCode.ALREADY_PAID,
        ErrorCode.PAYMENT_UNRESOLVED,
        ErrorCode.CUSTOMER_HAS_UNRESOLVED_PURCHASE,
        ErrorCode.ALREADY_RETRIED,
        ErrorCode.PROBABLE_DUPLICATE_PURCHASE,
    }
)


def _count(*, replayed_route: str | None = None, refused_code: str | None = None) -> None:
    if replayed_route:
        IDEMPOTENT_REPLAYS.labels(route=replayed_route).inc()
    if refused_code in _BLOCKED_DUPLICATE_CODES:
        BLOCKED_DUPLICATES.labels(reason=refused_code).inc()


def _keyed(request, route: str, run: Callable[[KeyedRequest], Keyed]) -> Keyed:
    """One keyed request through the core's ladder (payments.keyed): this face only reads
    the key and counts what happened (metrics)."""
    keyed_request = KeyedRequest(
        api_client=request.auth,
        route=route,
        key=key_from_headers(request.headers),
        path=request.path,
        body=request.data,
    )
    try:
        keyed = run(keyed_request)
    except (DomainError, Problem) as exc:
        _count(refused_code=exc.code)
        raise
    if keyed.replayed:
        _count(replayed_route=route)
    return keyed


def _effect(request, route: str, create: Callable[..., Created], **options) -> Keyed:
    return _keyed(
        request, route, lambda keyed_request: keyed_effect(keyed_request, create=create, **options)
    )


def _replayed(keyed: Keyed) -> Response | None:
    """A replay of a finished request: 200 with the resource's current state."""
    if not keyed.replayed:
        return None
    return Response(
        _render_current(keyed.resource_type, keyed.resource_id),
        status=200,
        headers={REPLAYED_HEADER: "true"},
    )


def _replay_first(request, route: str) -> Response | None:
    """A replay (record done, same body) is answered before the purchase read and
    the body's validation, which a replay does not need (payments.api.idempotency
    .idempotency_replay_of); anything else returns None and takes the usual path."""
    key = key_from_headers(request.headers)
    if getattr(request, NOT_A_REPLAY, False):
        return None
    body = replay_body(request)
    if body is None:
        return None
    record = key_replay_of(
        api_client=request.auth, route=route, key=key, path=request.path, body=body
    )
    if record is None:
        return None
    _count(replayed_route=route)
    return Response(
        _render_current(record.resource_type, record.resource_id),
        status=200,
        headers={REPLAYED_HEADER: "true"},
    )


def _operation_answer(op: PaymentOperation) -> Response:
    """201 succeeded; 202 pending/awaiting/unknown; 402 a failed payment (a decline)."""
    body = presenters.operation_view(op)
    headers = {"Location": _location("operation", op.id)}
    if op.outcome == Outcome.SUCCEEDED:
        return Response(body, status=201, headers=headers)
    if op.outcome == Outcome.FAILED:
        action = body["next_action"]
        is_payment = op.kind in _PAYMENT_KIND_VALUES
        status = 402 if is_payment else 409
        code = op.reason or ("payment_failed" if is_payment else f"{op.kind}_failed")
        detail = (
            "The payment was declined; no money moved."
            if code == "card_declined"
            else f"The {op.kind} failed at the provider ({code})."
        )
        problem = problem_body(
            code=code,
            detail=detail,
            status=status,
            retry=action["retry"],
            owner=action["owner"],
            purchase=op.purchase_id,
            operation=op.id,
            action_message=action["message"],
        )
        problem["next_action"]["code"] = action["code"]
        return Response(problem, status=status, headers=headers, content_type=PROBLEM_CONTENT_TYPE)
    return Response(body, status=202, headers=headers)


def _operation_keyed_answer(keyed: Keyed) -> Response:
    return _replayed(keyed) or _operation_answer(
        keyed.operation or _load_operation(_made_operation_id(keyed))
    )


def _made_operation_id(keyed: Keyed) -> str:
    assert keyed.operation_id is not None  # an operation route's effect made one
    return keyed.operation_id


# -- OpenAPI helpers ----------------------------------------------------------------

IDEMPOTENCY_HEADER = OpenApiParameter(
    name="Idempotency-Key",
    location=OpenApiParameter.HEADER,
    required=True,
    type={"type": "string", "minLength": 1, "maxLength": 255},
    description="One key per intended effect (max 255 characters). Reuse it only to retry "
    "the same request with the same body.",
)


def _problems(*statuses: int, **described: str) -> dict:
    base = {
        400: "invalid_request / idempotency_key_required",
        401: "unauthenticated",
        403: "forbidden_scope",
        404: "not_found",
        405: "method_not_allowed",
        406: "not_acceptable",
        415: "unsupported_media_type",
        429: "rate_limited (Retry-After)",
        500: "internal_error",
    }
    out = {}
    for status in sorted(set(statuses) | set(base)):
        text = described.get(f"s{status}", base.get(status, "problem"))
        out[(status, PROBLEM_CONTENT_TYPE)] = OpenApiResponse(ProblemOut, description=text)
    return out


def _ok(status: int, serializer, description: str, examples=None) -> dict:
    return {
        (status, "application/json"): OpenApiResponse(
            serializer, description=description, examples=examples or []
        )
    }


IDEMPOTENT_NOTE = (
    " Requires `Idempotency-Key`. A replay of a finished request answers 200 with the "
    "resource's current state and `Idempotent-Replayed: true`; the same key with another body "
    "is 422 `idempotency_key_reused`; while the first request runs, 409 `request_in_progress` "
    "with `Retry-After`."
)


# -- views --------------------------------------------------------------------------


class ApiView(APIView):
    required_scopes: dict[str, str] = {}

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        # Answers carry customer e-mails and status links (a customer's credential) and
        # are per API client: no shared or browser cache may keep them.
        response.setdefault("Cache-Control", "no-store")
        return response

    def initial(self, request, *args, **kwargs):
        # PostgreSQL text cannot hold NUL: an id with one would be a 500 at the first query.
        if any("\x00" in str(v) for v in kwargs.values()):
            raise Problem(
                code=ErrorCode.INVALID_REQUEST,
                status=400,
                detail="A path id contains a NUL byte; no such resource.",
            )
        super().initial(request, *args, **kwargs)


class ProductListApi(ApiView):
    required_scopes = {"GET": READ}

    @extend_schema(
        operation_id="products_list",
        summary="The catalogue",
        responses={**_ok(200, ProductListOut, "Products", [EXAMPLE_PRODUCTS]), **_problems()},
    )
    def get(self, request):
        return Response(
            {"products": [presenters.product_view(p) for p in selectors.products_list()]}
        )


class QuoteCreateApi(ApiView):
    required_scopes = {"POST": WRITE}

    @extend_schema(
        operation_id="quotes_create",
        summary="Price items",
        description="Quote items at current prices; a quote expires." + IDEMPOTENT_NOTE,
        request=QuoteCreateIn,
        parameters=[IDEMPOTENCY_HEADER],
        examples=[EXAMPLE_QUOTE_REQUEST],
        responses={
            **_ok(201, QuoteOut, "Quote created"),
            **_ok(200, QuoteOut, "Replay of a finished request"),
            **_problems(
                409,
                422,
                s409="request_in_progress",
                s422="idempotency_key_reused / unknown sku / unsupported currency",
            ),
        },
    )
    def post(self, request):
        key_from_headers(request.headers)
        data = _validated(QuoteCreateIn, request.data, strict=True)

        def create() -> Created:
            quote = services.quote_create(
                api_client=request.auth,
                currency=data["currency"].lower(),
                items=[{"sku": i["sku"], "quantity": i["quantity"]} for i in data["items"]],
            )
            return Created("quote", quote.id)

        keyed = _effect(request, "quotes_create", create)
        return _replayed(keyed) or Response(
            presenters.quote_view(Quote.objects.get(pk=keyed.resource_id)), status=201
        )


class PurchaseCreateApi(ApiView):
    # GET lists (the route is one path for both; the idempotency scope is POST's name).
    required_scopes = {"POST": WRITE, "GET": READ}

    @extend_schema(
        operation_id="purchases_list",
        summary="Your purchases, newest first",
        description="Filtered by status (comma-separated), customer reference (matched as "
        "stored: trimmed, NFKC, case-insensitive), created time and amount; "
        "keyset-paginated: pass `next_cursor` as `cursor` for the next page.",
        parameters=PURCHASE_LIST_PARAMETERS,
        responses={**_ok(200, PurchaseListOut, "Purchases"), **_problems()},
    )
    def get(self, request):
        where, cursor, limit = purchase_list_query(request.query_params)
        rows = selectors.purchases_list_for_client(
            api_client=request.auth, where=where, cursor=cursor, limit=limit
        )
        return Response(
            {
                "purchases": [presenters.purchase_view(p) for p in rows],
                "next_cursor": purchase_list_cursor(rows[-1]) if len(rows) == limit else None,
            }
        )

    @extend_schema(
        operation_id="purchases_create",
        summary="Open a purchase for an accepted quote",
        description=(
            "Creates the purchase's durable identity before any money moves. A quote backs "
            "at most one purchase: a second request with the same quote answers 200 with "
            "that purchase, whatever the customer fields say. Customer references are "
            "trimmed, NFKC-normalised and matched case-insensitively, per API client. While "
            "the customer has an unresolved purchase, another one is refused (409 "
            "`customer_has_unresolved_purchase`); the same basket within the duplicate "
            "window of a paid or unresolved purchase is refused (409 "
            "`probable_duplicate_purchase`). Only the buyer lifts either: "
            "`buyer_confirmation` (the code the buyer got on the earlier purchase's status "
            "page), or, for a client with storefront confirmation enabled, "
            "`acknowledge_unresolved` naming the earlier purchase." + IDEMPOTENT_NOTE
        ),
        request=PurchaseCreateIn,
        parameters=[IDEMPOTENCY_HEADER],
        examples=[EXAMPLE_PURCHASE_REQUEST],
        responses={
            **_ok(201, PurchaseOut, "Purchase created", [EXAMPLE_PURCHASE]),
            **_ok(200, PurchaseOut, "Replay of a finished request"),
            **_problems(
                409,
                422,
                s409="quote_expired / quote_superseded / "
                "customer_has_unresolved_purchase / "
                "probable_duplicate_purchase / request_in_progress",
                s422="idempotency_key_reused / quote_not_found / "
                "invalid_email / invalid_buyer_confirmation",
            ),
        },
    )
    def post(self, request):
        key_from_headers(request.headers)
        data = _validated(PurchaseCreateIn, request.data)

        def create() -> Created:
            opened = services.purchase_open(
                api_client=request.auth,
                quote_id=data["quote_id"],
                quote_version=data["quote_version"],
                customer_reference=data["customer"]["reference"],
                customer_email=data["customer"].get("email", ""),
                acknowledge_unresolved=tuple(data["acknowledge_unresolved"]),
                buyer_confirmation=data.get("buyer_confirmation") or "",
                storefront_confirmation=request.auth.storefront_confirmation,
                channel=PurchaseChannel.API,
            )
            return Created("purchase", opened.purchase.id, created=opened.created)

        keyed = _effect(request, "purchases_create", create)
        replayed = _replayed(keyed)
        if replayed is not None:
            return replayed
        # 200: the quote already backed this purchase (the same intent, nothing new).
        purchase = Purchase.objects.select_related("quote").get(pk=keyed.resource_id)
        return Response(
            presenters.purchase_view(purchase),
            status=201 if keyed.created else 200,
            headers={"Location": _location("purchase", purchase.id)},
        )


class PurchaseDetailApi(ApiView):
    required_scopes = {"GET": READ}

    @extend_schema(
        operation_id="purchases_retrieve",
        summary="The purchase view",
        responses={**_ok(200, PurchaseOut, "Purchase", [EXAMPLE_PURCHASE]), **_problems()},
    )
    def get(self, request, purchase_id: str):
        return Response(presenters.purchase_view(_purchase_or_404(request, purchase_id)))


class PurchaseCancelApi(ApiView):
    required_scopes = {"POST": WRITE}

    @extend_schema(
        operation_id="purchases_cancel",
        summary="Cancel a purchase before payment",
        description="The buyer cancels a purchase before any payment was claimed (only "
        "provider-confirmed failures may precede it). 409 `cancel_not_allowed` "
        "otherwise." + IDEMPOTENT_NOTE,
        request=EmptyIn,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            **_ok(200, PurchaseOut, "Cancelled (or replay)"),
            **_problems(409, 422, s409="cancel_not_allowed / request_in_progress"),
        },
    )
    def post(self, request, purchase_id: str):
        key_from_headers(request.headers)
        purchase = _purchase_or_404(request, purchase_id)
        _validated(EmptyIn, request.data)

        def create() -> Created:
            services.purchase_cancel(purchase_id=purchase.id, api_client=request.auth)
            return Created("purchase", purchase.id)

        keyed = _effect(request, "purchases_cancel", create)
        return _replayed(keyed) or Response(
            presenters.purchase_view(Purchase.objects.select_related("quote").get(pk=purchase.pk)),
            status=200,
        )


class DeliverableApi(ApiView):
    required_scopes = {"GET": READ}

    @extend_schema(
        operation_id="purchases_deliverable_retrieve",
        summary="Redeliver a digital good",
        description="The stored result of the deliverable step, kept for the redelivery "
        "period; 404 `deliverable_not_available` otherwise.\n\n"
        "**x402** (when offered for the purchase): unpaid -> 402 "
        "`payment_required` with the `PAYMENT-REQUIRED` header (x402 v2 "
        "requirements from the accepted quote). Repeat with `PAYMENT-SIGNATURE` "
        "(needs `purchases:write`): 200 the deliverable + `PAYMENT-RESPONSE`; 202 "
        "while the report is prepared or the settlement waits for the chain "
        "(`settlement_pending`, `payment_unknown`: don't pay again); 402 "
        "`payment_failed` (sign a new authorization). The same payload again is "
        "a replay (`Payment-Replayed: true`), never a second settlement; 409 "
        "`authorization_reused` / `payment_identifier_reused`. Refunds on this rail "
        "are a separate transfer back; there is no void.",
        parameters=[
            OpenApiParameter(
                "PAYMENT-SIGNATURE",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="x402 v2 payment payload (base64 JSON)",
            )
        ],
        responses={
            **_ok(200, DeliverableOut, "Deliverable"),
            **_ok(202, DeliverablePendingOut, "x402: preparing, or waiting for the chain"),
            **_problems(
                402,
                409,
                503,
                s402="payment_required / payment_failed / "
                "payment_requirements_mismatch / "
                "authorization_expires_too_soon (x402)",
                s409="payment_unresolved / already_paid / authorization_reused",
                s503="chain_unreachable (x402: nothing charged)",
            ),
        },
    )
    def get(self, request, purchase_id: str):
        purchase = _purchase_or_404(request, purchase_id)
        # x402 (docs/walkthrough.md#api-rules-the-code-relies-on): the deliverable is the paid
        # resource. Paying is a write.
        header = request.headers.get(x402_views.PAYMENT_SIGNATURE_HEADER)
        if header is not None:
            if not request.auth.has_scope(WRITE):
                raise Problem(
                    code=ErrorCode.FORBIDDEN_SCOPE,
                    status=403,
                    owner=Owner.SUPPORT,
                    detail=f"This API key lacks the '{WRITE}' scope.",
                )
            return x402_views.deliverable_pay(request, purchase, header)
        found = deliverable_for(purchase.id)
        if found is None and x402_views.deliverable_unpaid(purchase):
            return x402_views.deliverable_state(request, purchase)
        if found is None:
            raise Problem(
                code=ErrorCode.DELIVERABLE_NOT_AVAILABLE,
                status=404,
                owner=Owner.NONE,
                purchase=purchase.id,
                detail="No deliverable is available for this purchase (not a "
                "digital good, not produced yet, or its redelivery period "
                "is over).",
            )
        return Response(
            {
                "job_reference": found["job_reference"],
                "result": found["result"],
                "expires_at": presenters.iso(found["expires_at"]),
            }
        )


class PaymentCreateApi(ApiView):
    required_scopes = {"POST": WRITE}

    @extend_schema(
        operation_id="purchases_payments_create",
        summary="Pay for a purchase",
        description=(
            "Charges (capture `automatic`) or authorizes (capture `manual`) the quote's "
            "amount. 201 succeeded; 202 pending, awaiting or **unknown** — unknown means the "
            "provider may have applied it: do not retry, poll the operation; 402 declined. "
            "A purchase with a succeeded payment answers 409 `already_paid`, one with an "
            "unresolved payment 409 `payment_unresolved`, whatever key is used." + IDEMPOTENT_NOTE
        ),
        request=PaymentCreateIn,
        parameters=[IDEMPOTENCY_HEADER],
        examples=[
            EXAMPLE_CHARGE_REQUEST,
            EXAMPLE_RETRY_REQUEST,
            EXAMPLE_UNKNOWN,
            EXAMPLE_DECLINE,
            EXAMPLE_ALREADY_PAID,
            EXAMPLE_REUSED,
        ],
        responses={
            **_ok(
                201,
                OperationOut,
                "Succeeded (charged, or authorized for manual capture)",
                examples=[EXAMPLE_SUCCEEDED],
            ),
            **_ok(
                202,
                OperationOut,
                "Pending, awaiting or unknown: follow next_action",
                examples=[EXAMPLE_UNKNOWN],
            ),
            **_ok(200, OperationOut, "Replay of a finished request: current state"),
            **_problems(
                402,
                409,
                422,
                503,
                s402="declined (card_declined, ...)",
                s409="already_paid / payment_unresolved / retry_not_allowed / "
                "original_succeeded (the retried payment did succeed) / "
                "request_in_progress",
                s422="amount_mismatch / idempotency_key_reused / retry_needs_new_method",
                s503="workflow_halted",
            ),
        },
    )
    def post(self, request, purchase_id: str):
        replay = _replay_first(request, "purchases_payments_create")
        if replay is not None:
            return replay
        purchase = _purchase_or_404(request, purchase_id)
        data = _validated(PaymentCreateIn, request.data, strict=True)

        keyed = _keyed(
            request,
            "purchases_payments_create",
            lambda keyed_request: payment_request(
                keyed_request,
                purchase_id=purchase.id,
                payment_method=data["payment_method"],
                capture_method=data["capture"],
                retry_of=data["retry_of"],
                amount=data["amount"],
                currency=data["currency"],
            ),
        )
        return _operation_keyed_answer(keyed)


class _LinkedOperationApi(ApiView):
    """capture / void / refunds: a new operation linked to the purchase's payment."""

    route = ""

    kind: OperationKind
    input_serializer: type[serializers.Serializer]

    def post(self, request, purchase_id: str):
        replay = _replay_first(request, self.route)
        if replay is not None:
            return replay
        purchase = _purchase_or_404(request, purchase_id)
        data = _validated(self.input_serializer, request.data, strict=True)
        keyed = _keyed(
            request,
            self.route,
            lambda keyed_request: follow_up_request(
                keyed_request,
                purchase_id=purchase.id,
                kind=self.kind,
                amount=data.get("amount"),
                currency=data.get("currency"),
            ),
        )
        return _operation_keyed_answer(keyed)


def _linked_schema(operation_id: str, summary: str, description: str, request_serializer):
    return extend_schema(
        operation_id=operation_id,
        summary=summary,
        description=description + IDEMPOTENT_NOTE,
        request=request_serializer,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            **_ok(201, OperationOut, "Succeeded at the provider"),
            **_ok(202, OperationOut, "Pending, awaiting approval/provider, or unknown"),
            **_ok(200, OperationOut, "Replay of a finished request: current state"),
            **_problems(
                409,
                422,
                503,
                s409="nothing_to_capture / not_refundable / "
                "fulfilment_started (void) / operation failed / request_in_progress",
                s422="idempotency_key_reused / amount too large",
                s503="workflow_halted",
            ),
        },
    )


class CaptureApi(_LinkedOperationApi):
    required_scopes = {"POST": WRITE}
    route = "purchases_capture_create"
    input_serializer = EmptyIn

    kind = OperationKind.CAPTURE

    @_linked_schema(
        "purchases_capture_create",
        "Capture an authorization",
        "Captures the purchase's authorized payment.",
        EmptyIn,
    )
    def post(self, request, purchase_id: str):
        return super().post(request, purchase_id)


class VoidApi(_LinkedOperationApi):
    required_scopes = {"POST": WRITE}
    route = "purchases_void_create"
    input_serializer = EmptyIn

    kind = OperationKind.VOID

    @_linked_schema(
        "purchases_void_create",
        "Void an authorization",
        "Cancels the purchase's uncaptured authorization.",
        EmptyIn,
    )
    def post(self, request, purchase_id: str):
        return super().post(request, purchase_id)


class RefundApi(_LinkedOperationApi):
    required_scopes = {"POST": REFUNDS}
    route = "purchases_refunds_create"
    input_serializer = RefundCreateIn

    kind = OperationKind.REFUND

    @extend_schema(examples=[EXAMPLE_REFUND_REQUEST])
    @_linked_schema(
        "purchases_refunds_create",
        "Refund a captured payment",
        "Needs `refunds:write`. Starts `awaiting_approval` unless the client's "
        "automatic-refund allowance covers it; shown as refunded only once the "
        "provider confirms. On an x402 purchase the refund is a separate token "
        "transfer back to the payer: it always waits for an operator's approval "
        "(409 `x402_refund_signer_missing` when no refund signer is "
        "configured); there is no void.",
        RefundCreateIn,
    )
    def post(self, request, purchase_id: str):
        return super().post(request, purchase_id)


class OperationDetailApi(ApiView):
    required_scopes = {"GET": READ}

    @extend_schema(
        operation_id="operations_retrieve",
        summary="One money movement",
        responses={
            **_ok(200, OperationOut, "Operation", examples=[EXAMPLE_UNKNOWN]),
            **_problems(),
        },
    )
    def get(self, request, operation_id: str):
        return Response(presenters.operation_view(_operation_or_404(request, operation_id)))


class OperationReconcileApi(ApiView):
    required_scopes = {"POST": WRITE}

    @extend_schema(
        operation_id="operations_reconcile",
        summary="Read the provider's record now",
        description="Read-only at the provider; settles an unknown operation if the provider "
        "has a record of it. 409 `already_settled` if the provider settled it (an "
        "outcome a person resolved, grade `acknowledged`, is read back and may be "
        "overturned by the provider's record); 409 `dispatch_in_progress` while its "
        "send is still in flight (no verdict while money can still move). Works while "
        "workflows are halted. Naturally idempotent: no key needed. At most one "
        "read-back per operation every few seconds: within that cooldown the "
        "answer is the current state with `Retry-After`.",
        request=None,
        responses={
            **_ok(200, OperationOut, "Current state after the read-back"),
            **_problems(409, 503, s409="already_settled / dispatch_in_progress"),
        },
    )
    def post(self, request, operation_id: str):
        op = _operation_or_404(request, operation_id)
        _assert_no_transaction_open()
        wait = services.operation_reconcile_on_demand(operation_id=op.id, actor=_actor(request))
        response = Response(presenters.operation_view(_load_operation(op.id)))
        if wait:
            # Read back moments ago: the current state, no provider call.
            response["Retry-After"] = str(wait)
        return response


class OperationReplayApi(ApiView):
    required_scopes = {"POST": RESOLVE}

    @extend_schema(
        operation_id="operations_replay",
        summary="Resend with the same provider key",
        description="Needs `operations:resolve`, never by the client that requested the "
        "operation; only inside the provider's key window and only where the "
        "provider deduplicates keys (otherwise 409 `replay_unsupported`)." + IDEMPOTENT_NOTE,
        request=None,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            **_ok(201, OperationOut, "Succeeded"),
            **_ok(202, OperationOut, "Still unsettled"),
            **_ok(200, OperationOut, "Replay of a finished request"),
            **_problems(
                402,
                409,
                422,
                503,
                s409="replay_unsupported / already_settled / request_in_progress",
                s403="forbidden_scope / replayer_is_requester",
            ),
        },
    )
    def post(self, request, operation_id: str):
        key_from_headers(request.headers)
        op = _operation_or_404(request, operation_id)

        def create(bind) -> Created:
            _assert_no_transaction_open()
            # Refusals (requester, unsupported provider, window closed) come before any
            # provider request and release the key.
            services.operation_replay(
                operation_id=op.id, actor=_actor(request), acting_client=request.auth
            )
            return Created("operation", op.id)

        # Resending is the effect: no dispatch of its own.
        keyed = _effect(request, "operations_replay", create, in_transaction=False, dispatch=False)
        return _replayed(keyed) or _operation_answer(_load_operation(op.id))


class OperationResolveApi(ApiView):
    required_scopes = {"POST": RESOLVE}

    @extend_schema(
        operation_id="operations_resolve",
        summary="Manual resolution",
        description="Needs `operations:resolve`; never by the client that requested the "
        "operation (403 `resolver_is_requester`); `reason` is required and "
        "audited. The provider is read back first: a record that contradicts "
        "the outcome refuses it (409 `provider_contradicts`); unreachable, the "
        "outcome is accepted with grade `acknowledged`. Resolving an "
        "`awaiting_buyer` payment `failed` cancels it at the provider first." + IDEMPOTENT_NOTE,
        request=ResolveIn,
        parameters=[IDEMPOTENCY_HEADER],
        examples=[EXAMPLE_RESOLVE_REQUEST],
        responses={
            **_ok(200, OperationOut, "Resolved (or replay)"),
            **_problems(
                409,
                422,
                s403="forbidden_scope / resolver_is_requester",
                s409="provider_contradicts (the provider's record says "
                "otherwise) / provider_cancel_failed / not_resolvable / "
                "request_in_progress",
            ),
        },
    )
    def post(self, request, operation_id: str):
        key_from_headers(request.headers)
        op = _operation_or_404(request, operation_id)
        data = _validated(ResolveIn, request.data)

        def create(bind) -> Created:
            # Not atomic here: the core reads the provider back first (network I/O) and
            # binds the key inside its own resolving transaction.
            _assert_no_transaction_open()
            services.operation_resolve_manual(
                operation_id=op.id,
                outcome=data["outcome"],
                reason=data["reason"],
                actor=_actor(request),
                acting_client=request.auth,
                bind=lambda resolved: bind("operation", resolved.id),
            )
            return Created("operation", op.id)

        keyed = _effect(request, "operations_resolve", create, in_transaction=False, dispatch=False)
        return _replayed(keyed) or Response(
            presenters.operation_view(_load_operation(op.id)), status=200
        )


class RefundDeclineApi(ApiView):
    required_scopes = {"POST": RESOLVE}

    @extend_schema(
        operation_id="operations_decline",
        summary="Decline a refund awaiting approval",
        description="Needs `operations:resolve`; `reason` is required and audited. The refund "
        "settles `failed` (`refund_declined`), nothing is sent to the provider, "
        "and its amount is refundable again. 409 `not_awaiting_approval` "
        "otherwise." + IDEMPOTENT_NOTE,
        request=DeclineIn,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            **_ok(200, OperationOut, "Declined (or replay)"),
            **_problems(
                409,
                422,
                s409="not_awaiting_approval / request_in_progress",
                s422="reason_required / idempotency_key_reused",
            ),
        },
    )
    def post(self, request, operation_id: str):
        key_from_headers(request.headers)
        op = _operation_or_404(request, operation_id)
        data = _validated(DeclineIn, request.data, strict=True)

        def create() -> Created:
            services.refund_decline(
                operation_id=op.id,
                reason=data["reason"],
                actor=_actor(request),
                acting_client=request.auth,
            )
            return Created("operation", op.id)

        keyed = _effect(request, "operations_decline", create, dispatch=False)
        return _replayed(keyed) or Response(
            presenters.operation_view(_load_operation(op.id)), status=200
        )


class UnknownRouteApi(ApiView):
    """Anything else under /api/v1/: a problem document, not Django's HTML 404 page."""

    schema = None  # not an endpoint: kept out of the OpenAPI document

    def _not_found(self, request, *args, **kwargs):
        raise Problem(
            code=ErrorCode.NOT_FOUND, status=404, detail="No such endpoint under /api/v1/."
        )

    get = post = put = patch = delete = _not_found


class ClientLimitsApi(ApiView):
    required_scopes = {"GET": READ}

    @extend_schema(
        operation_id="clients_me_limits",
        summary="Spending limit and exposure",
        responses={**_ok(200, LimitsOut, "Limits", [EXAMPLE_LIMITS]), **_problems()},
    )
    def get(self, request):
        return Response(presenters.client_limits_view(request.auth))
