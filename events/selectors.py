"""Reads: the events feed, an event's document (the one shape the feed and the webhook
body share), endpoints and their delivery log."""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from .models import EndpointKind, Event, WebhookDelivery, WebhookEndpoint

FEED_MAX = 100
WAIT_MAX_SECONDS = 25  # the published bound; EVENTS_WAIT_MAX_SECONDS may lower it
_WAIT_POLL_SECONDS = 0.5


def event_document(event: Event) -> dict:
    return {
        "id": event.public_id,
        "type": event.type,
        "created": event.created_at.isoformat().replace("+00:00", "Z"),
        "purchase": event.purchase_id,
        "sequence": event.sequence,
        "cursor": str(event.id),
        "data": event.data,
    }


def _wait_max() -> float:
    return min(float(WAIT_MAX_SECONDS), settings.EVENTS_WAIT_MAX_SECONDS)


def _feed_query(*, api_client_id: str, after: int, types: list[str], purchase_id: str | None):
    # Only events old enough that every transaction that wrote an earlier id has committed
    # (ids are given at insert, rows become visible at commit): a reader's cursor never
    # passes an event that was still invisible (EVENTS_FEED_SETTLE_SECONDS).
    visible = timezone.now() - timedelta(seconds=settings.EVENTS_FEED_SETTLE_SECONDS)
    qs = Event.objects.filter(api_client_id=api_client_id, id__gt=after, created_at__lte=visible)
    if types:
        qs = qs.filter(type__in=types)
    if purchase_id:
        qs = qs.filter(purchase_id=purchase_id)
    return qs.order_by("id")


def events_feed(
    *,
    api_client_id: str,
    after: int = 0,
    types: list[str] | None = None,
    purchase_id: str | None = None,
    limit: int = 50,
    wait_seconds: float = 0,
) -> list[Event]:
    """The client's events after the cursor, oldest first. With `wait_seconds` (at most
    EVENTS_WAIT_MAX_SECONDS), a bounded long-poll: answers as soon as one is there."""
    limit = max(1, min(limit, FEED_MAX))
    deadline = time.monotonic() + max(0.0, min(wait_seconds, _wait_max()))
    while True:
        rows = list(
            _feed_query(
                api_client_id=api_client_id, after=after, types=types or [], purchase_id=purchase_id
            )[:limit]
        )
        if rows or time.monotonic() >= deadline:
            return rows
        time.sleep(_WAIT_POLL_SECONDS)


def purchase_events_wait(
    *, purchase_id: str, after_sequence: int, wait_seconds: float
) -> list[Event]:
    """A purchase's events after `after_sequence`, waiting up to `wait_seconds` (at most
    EVENTS_WAIT_MAX_SECONDS) for the first. Sequence numbers of one purchase commit in order (the
    counter row's lock), so no settle delay is needed here. The caller checks ownership."""
    deadline = time.monotonic() + max(0.0, min(wait_seconds, _wait_max()))
    while True:
        rows = list(
            Event.objects.filter(purchase_id=purchase_id, sequence__gt=after_sequence).order_by(
                "sequence"
            )[:FEED_MAX]
        )
        if rows or time.monotonic() >= deadline:
            return rows
        time.sleep(_WAIT_POLL_SECONDS)


# A client's own endpoints are its storefront ones: an ACP platform's order-webhook endpoint
# is set through acp (acp_platform), never through the storefront API.


def endpoints_for_client(api_client_id: str) -> list[WebhookEndpoint]:
    return list(
        WebhookEndpoint.objects.filter(
            api_client_id=api_client_id, kind=EndpointKind.STANDARD
        ).order_by("created_at")
    )


def endpoint_for_client(*, endpoint_id: str, api_client_id: str) -> WebhookEndpoint | None:
    return WebhookEndpoint.objects.filter(
        pk=endpoint_id, api_client_id=api_client_id, kind=EndpointKind.STANDARD
    ).first()


def endpoint_get(endpoint_id: str) -> WebhookEndpoint | None:
    return WebhookEndpoint.objects.filter(pk=endpoint_id).first()


def delivery_get(delivery_id: int) -> WebhookDelivery | None:
    return WebhookDelivery.objects.filter(pk=delivery_id).first()


def endpoints_all(limit: int = 200) -> list[WebhookEndpoint]:
    return list(WebhookEndpoint.objects.order_by("enabled", "-failing_since", "created_at")[:limit])


def deliveries_of(
    *, endpoint_id: str | None = None, purchase_id: str | None = None, limit: int = 50
) -> list[WebhookDelivery]:
    qs = WebhookDelivery.objects.select_related("event", "endpoint")
    if endpoint_id:
        qs = qs.filter(endpoint_id=endpoint_id)
    if purchase_id:
        qs = qs.filter(purchase_id=purchase_id)
    return list(qs.order_by("-id")[:limit])


def endpoints_disabled_by_failures() -> list[WebhookEndpoint]:
    """The console's queue: endpoints Verity turned off because every delivery failed."""
    return list(
        WebhookEndpoint.objects.filter(
            enabled=False, disabled_at__isnull=False, disabled_reason__startswith="every delivery"
        ).order_by("-disabled_at")
    )
