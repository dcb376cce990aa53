"""REST: webhook endpoints (scope `webhooks:manage`) and the events feed
(`purchases:read`). Thin: parse, call one service or selector, render.

The two POSTs that make something (an endpoint, a new secret) are keyed like every other
write: they go through the core's ladder (payments.keyed, via the REST face's `_effect`),
so a retried create makes one endpoint and a retried rotation rotates once. A replay
answers 200 with the endpoint and its current secret: the answer the first request's
caller may never have read (only to the same API client, same key, same body)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from payments.api.idempotency import key_from_headers
from payments.api.problems import Problem
from payments.api.views import (
    IDEMPOTENCY_HEADER,
    IDEMPOTENT_NOTE,
    ApiView,
    _effect,
    _ok,
    _problems,
)
from payments.errors import ErrorCode
from payments.keyed import REPLAYED_HEADER, Created, Keyed

from . import selectors, services
from .models import EventType, WebhookDelivery

MANAGE = "webhooks:manage"
READ = "purchases:read"


def endpoint_view(endpoint) -> dict:
    """Never the secret: it is shown once, by the call that makes it."""
    return {
        "id": endpoint.id,
        "url": endpoint.url,
        "description": endpoint.description,
        "event_types": endpoint.event_types,
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason or None,
        "failing_since": endpoint.failing_since,
        "created_at": endpoint.created_at,
        "secret_rotation_overlap_until": endpoint.previous_secret_expires_at,
    }


def delivery_view(delivery: WebhookDelivery) -> dict:
    return {
        "id": delivery.id,
        "event": delivery.msg_id,
        "type": delivery.event.type if delivery.event is not None else None,
        "purchase": delivery.purchase_id,
        "state": delivery.state,
        "attempts": delivery.attempts,
        "last_status": delivery.last_status,
        "last_error": delivery.last_error or None,
        "delivered_at": delivery.delivered_at,
        "next_attempt_at": delivery.next_attempt_at,
    }


class EndpointIn(serializers.Serializer):
    url = serializers.URLField(max_length=2000)
    event_types = serializers.ListField(
        child=serializers.ChoiceField(EventType.choices),
        required=False,
        max_length=len(EventType.values),
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)


class EndpointPatchIn(serializers.Serializer):
    url = serializers.URLField(max_length=2000, required=False)
    event_types = serializers.ListField(
        child=serializers.ChoiceField(EventType.choices),
        required=False,
        max_length=len(EventType.values),
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)


class RotateIn(serializers.Serializer):
    overlap_seconds = serializers.IntegerField(
        min_value=0, max_value=services.MAX_ROTATION_OVERLAP_SECONDS, required=False, default=86400
    )


EndpointOut = inline_serializer(
    "WebhookEndpoint",
    {
        "id": serializers.CharField(),
        "url": serializers.URLField(),
        "description": serializers.CharField(),
        "event_types": serializers.ListField(child=serializers.CharField()),
        "enabled": serializers.BooleanField(),
        "disabled_reason": serializers.CharField(allow_null=True),
        "failing_since": serializers.DateTimeField(allow_null=True),
        "created_at": serializers.DateTimeField(),
        "secret_rotation_overlap_until": serializers.DateTimeField(allow_null=True),
    },
)
EndpointWithSecretOut = inline_serializer(
    "WebhookEndpointWithSecret",
    {"endpoint": EndpointOut, "secret": serializers.CharField(help_text="shown once")},
)
EndpointListOut = inline_serializer(
    "WebhookEndpointList", {"endpoints": serializers.ListField(child=EndpointOut)}
)
DeliveryListOut = inline_serializer(
    "WebhookDeliveryList",
    {
        "deliveries": serializers.ListField(
            child=inline_serializer(
                "WebhookDelivery",
                {
                    "id": serializers.IntegerField(),
                    "event": serializers.CharField(),
                    "type": serializers.CharField(),
                    "purchase": serializers.CharField(),
                    "state": serializers.CharField(),
                    "attempts": serializers.IntegerField(),
                    "last_status": serializers.IntegerField(allow_null=True),
                    "last_error": serializers.CharField(allow_null=True),
                    "delivered_at": serializers.DateTimeField(allow_null=True),
                    "next_attempt_at": serializers.DateTimeField(),
                },
            )
        )
    },
)
EventOut = inline_serializer(
    "Event",
    {
        "id": serializers.CharField(),
        "type": serializers.ChoiceField(EventType.choices),
        "created": serializers.DateTimeField(),
        "purchase": serializers.CharField(),
        "sequence": serializers.IntegerField(),
        "cursor": serializers.CharField(),
        "data": serializers.DictField(),
    },
)
EventListOut = inline_serializer(
    "EventList",
    {
        "events": serializers.ListField(child=EventOut),
        "next_cursor": serializers.CharField(help_text="pass as `after` to read on"),
    },
)


def _valid(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        raise Problem(
            code=ErrorCode.INVALID_REQUEST,
            status=400,
            detail=f"Invalid request: {sorted(serializer.errors)}",
        )
    return serializer.validated_data


def _refused(exc: services.EndpointError) -> Problem:
    return Problem(code=ErrorCode.INVALID_REQUEST, status=400, detail=str(exc))


def _endpoint_or_404(request, endpoint_id: str):
    endpoint = selectors.endpoint_for_client(endpoint_id=endpoint_id, api_client_id=request.auth.pk)
    if endpoint is None:
        raise Problem(
            code=ErrorCode.NOT_FOUND,
            status=404,
            detail="No such webhook endpoint for this API client.",
        )
    return endpoint


def _actor(request) -> str:
    return f"api:{request.auth.name}"


def _with_secret(keyed: Keyed, made: list, status: int, keyed_client: str) -> Response:
    """The endpoint and its secret: made now, or (a replay) as it signs today."""
    if keyed.replayed:
        endpoint = _endpoint_of(keyed.resource_id, keyed_client)
        secret = services.endpoint_current_secret(endpoint)
        return Response(
            {"endpoint": endpoint_view(endpoint), "secret": secret},
            status=200,
            headers={REPLAYED_HEADER: "true"},
        )
    return Response(
        {"endpoint": endpoint_view(made[0].endpoint), "secret": made[0].secret}, status=status
    )


def _endpoint_of(endpoint_id: str, api_client_id: str):
    endpoint = selectors.endpoint_for_client(endpoint_id=endpoint_id, api_client_id=api_client_id)
    if endpoint is None:
        raise Problem(
            code=ErrorCode.NOT_FOUND,
            status=404,
            detail="The webhook endpoint this key made has been removed.",
        )
    return endpoint


class EndpointListApi(ApiView):
    required_scopes = {"GET": MANAGE, "POST": MANAGE}

    @extend_schema(
        operation_id="webhook_endpoints_list",
        summary="Your webhook endpoints",
        responses={**_ok(200, EndpointListOut, "Endpoints"), **_problems()},
    )
    def get(self, request):
        return Response(
            {
                "endpoints": [
                    endpoint_view(e) for e in selectors.endpoints_for_client(request.auth.pk)
                ]
            }
        )

    @extend_schema(
        operation_id="webhook_endpoints_create",
        summary="Add a webhook endpoint",
        description="The signing secret is in this answer (and a replay of it) "
        "only; store it." + IDEMPOTENT_NOTE,
        request=EndpointIn,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            **_ok(201, EndpointWithSecretOut, "Created"),
            **_ok(200, EndpointWithSecretOut, "Replay of a finished request"),
            **_problems(409, 422, s409="request_in_progress", s422="idempotency_key_reused"),
        },
    )
    def post(self, request):
        key_from_headers(request.headers)
        data = _valid(EndpointIn, request.data)
        made: list[services.EndpointWithSecret] = []

        def create() -> Created:
            try:
                made.append(
                    services.endpoint_create(
                        api_client_id=request.auth.pk,
                        url=data["url"],
                        event_types=data.get("event_types"),
                        description=data.get("description", ""),
                        actor=_actor(request),
                    )
                )
            except services.EndpointError as exc:
                raise _refused(exc) from None
            return Created("webhook_endpoint", made[0].endpoint.id)

        return _with_secret(
            _effect(request, "webhook_endpoints_create", create), made, 201, request.auth.pk
        )


class EndpointDetailApi(ApiView):
    required_scopes = {"GET": MANAGE, "PATCH": MANAGE, "DELETE": MANAGE}

    @extend_schema(
        operation_id="webhook_endpoints_retrieve",
        summary="One webhook endpoint",
        responses={**_ok(200, EndpointOut, "Endpoint"), **_problems()},
    )
    def get(self, request, endpoint_id: str):
        return Response(endpoint_view(_endpoint_or_404(request, endpoint_id)))

    @extend_schema(
        operation_id="webhook_endpoints_update",
        summary="Change the URL or event types, enable or disable",
        request=EndpointPatchIn,
        responses={**_ok(200, EndpointOut, "Endpoint"), **_problems()},
    )
    def patch(self, request, endpoint_id: str):
        endpoint = _endpoint_or_404(request, endpoint_id)
        data = _valid(EndpointPatchIn, request.data)
        try:
            endpoint = services.endpoint_update(endpoint=endpoint, actor=_actor(request), **data)
        except services.EndpointError as exc:
            raise _refused(exc) from None
        return Response(endpoint_view(endpoint))

    @extend_schema(
        operation_id="webhook_endpoints_delete",
        summary="Remove an endpoint",
        responses={(204, "application/json"): None, **_problems()},
    )
    def delete(self, request, endpoint_id: str):
        services.endpoint_delete(
            endpoint=_endpoint_or_404(request, endpoint_id), actor=_actor(request)
        )
        return Response(status=204)


class EndpointRotateApi(ApiView):
    required_scopes = {"POST": MANAGE}

    @extend_schema(
        operation_id="webhook_endpoints_rotate_secret",
        summary="New signing secret; the old one keeps signing for the overlap",
        description="A retried rotation rotates once." + IDEMPOTENT_NOTE,
        request=RotateIn,
        parameters=[IDEMPOTENCY_HEADER],
        responses={
            **_ok(200, EndpointWithSecretOut, "Rotated, or a replay"),
            **_problems(409, 422, s409="request_in_progress", s422="idempotency_key_reused"),
        },
    )
    def post(self, request, endpoint_id: str):
        key_from_headers(request.headers)
        endpoint = _endpoint_or_404(request, endpoint_id)
        data = _valid(RotateIn, request.data)
        made: list[services.EndpointWithSecret] = []

        def create() -> Created:
            try:
                made.append(
                    services.endpoint_rotate_secret(
                        endpoint=endpoint,
                        actor=_actor(request),
                        overlap_seconds=data["overlap_seconds"],
                    )
                )
            except services.EndpointError as exc:
                raise _refused(exc) from None
            return Created("webhook_endpoint", endpoint.id)

        return _with_secret(
            _effect(request, "webhook_endpoints_rotate_secret", create), made, 200, request.auth.pk
        )


class EndpointDeliveriesApi(ApiView):
    required_scopes = {"GET": MANAGE}

    @extend_schema(
        operation_id="webhook_endpoints_deliveries",
        summary="The endpoint's delivery log, newest first",
        responses={**_ok(200, DeliveryListOut, "Deliveries"), **_problems()},
    )
    def get(self, request, endpoint_id: str):
        endpoint = _endpoint_or_404(request, endpoint_id)
        return Response(
            {
                "deliveries": [
                    delivery_view(d) for d in selectors.deliveries_of(endpoint_id=endpoint.id)
                ]
            }
        )


def _int(value: str | None, name: str, default: int = 0) -> int:
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        raise Problem(
            code=ErrorCode.INVALID_REQUEST, status=400, detail=f"`{name}` must be an integer."
        ) from None
    if number < 0 or number > 2**62:
        raise Problem(
            code=ErrorCode.INVALID_REQUEST, status=400, detail=f"`{name}` is out of range."
        )
    return number


class EventListApi(ApiView):
    required_scopes = {"GET": READ}

    @extend_schema(
        operation_id="events_list",
        summary="Your events after a cursor, oldest first",
        description="Kept for EVENTS_RETENTION_DAYS (default 30). `wait` (seconds, at most 25) "
        "holds the request until an event is there: a bounded long-poll.",
        parameters=[
            OpenApiParameter("after", int, description="cursor: the last event's `cursor`"),
            OpenApiParameter("type", str, description="comma-separated event types"),
            OpenApiParameter("purchase", str, description="one purchase's events"),
            OpenApiParameter("limit", int, description="1..100, default 50"),
            OpenApiParameter("wait", int, description="long-poll seconds, 0..25"),
        ],
        responses={**_ok(200, EventListOut, "Events"), **_problems()},
    )
    def get(self, request):
        params = request.query_params
        types = [t for t in (params.get("type") or "").split(",") if t]
        unknown = [t for t in types if t not in EventType.values]
        if unknown:
            raise Problem(
                code=ErrorCode.INVALID_REQUEST,
                status=400,
                detail=f"Unknown event types: {', '.join(unknown)}.",
            )
        after = _int(params.get("after"), "after")
        purchase = params.get("purchase") or None
        if purchase and ("\x00" in purchase or len(purchase) > 40):
            raise Problem(
                code=ErrorCode.INVALID_REQUEST,
                status=400,
                detail="`purchase` is not a purchase id.",
            )
        rows = selectors.events_feed(
            api_client_id=request.auth.pk,
            after=after,
            types=types,
            purchase_id=purchase,
            limit=_int(params.get("limit"), "limit", 50) or 50,
            wait_seconds=min(_int(params.get("wait"), "wait"), 25),
        )
        return Response(
            {
                "events": [selectors.event_document(e) for e in rows],
                "next_cursor": str(rows[-1].id if rows else after),
            }
        )
