"""Webhook endpoints: create, change, rotate the secret, disable/enable, resend.

Every change writes its audit row in the same transaction. A secret is returned only by
the call that makes it (create, rotate); nothing else returns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_write

from .delivery import deliver_kick
from .destinations import DestinationRefused, destination_check
from .models import (
    DeliveryState,
    EndpointKind,
    Event,
    EventType,
    WebhookDelivery,
    WebhookEndpoint,
    new_secret_salt,
)
from .secrets import signing_secret

MAX_ENDPOINTS_PER_CLIENT = 16
MAX_ROTATION_OVERLAP_SECONDS = 7 * 86400


class EndpointError(ValueError):
    """A refused change (the message is safe to show)."""


@dataclass(frozen=True)
class EndpointWithSecret:
    endpoint: WebhookEndpoint
    secret: str  # shown once


def _types(event_types: list[str] | None) -> list[str]:
    wanted = sorted(set(event_types or []))
    unknown = [t for t in wanted if t not in EventType.values]
    if unknown:
        raise EndpointError(f"unknown event types: {', '.join(unknown)}")
    return wanted


def _url(url: str) -> str:
    if not url or len(url) > 2000:
        raise EndpointError("a URL of at most 2000 characters is required")
    try:
        destination_check(url)  # save-time check; the send re-checks (DNS rebinding)
    except DestinationRefused as exc:
        raise EndpointError(str(exc)) from None
    return url


def _audit(
    actor: str,
    action: str,
    endpoint: WebhookEndpoint,
    reason: str,
    before: dict | None = None,
    after: dict | None = None,
) -> None:
    audit_write(
        actor=actor,
        action=action,
        target_type="webhook_endpoint",
        target_id=endpoint.id,
        reason=reason or action,
        before=before,
        after=after,
    )


def _public(endpoint: WebhookEndpoint) -> dict:
    return {"url": endpoint.url, "event_types": endpoint.event_types, "enabled": endpoint.enabled}


def endpoint_create(
    *,
    api_client_id: str,
    url: str,
    event_types: list[str] | None = None,
    description: str = "",
    actor: str,
) -> EndpointWithSecret:
    url, types = _url(url), _types(event_types)
    with transaction.atomic():
        if (
            WebhookEndpoint.objects.filter(
                api_client_id=api_client_id, kind=EndpointKind.STANDARD
            ).count()
            >= MAX_ENDPOINTS_PER_CLIENT
        ):
            raise EndpointError(f"at most {MAX_ENDPOINTS_PER_CLIENT} endpoints per API client")
        endpoint = WebhookEndpoint.objects.create(
            api_client_id=api_client_id, url=url, event_types=types, description=description[:200]
        )
        _audit(actor, "webhook_endpoint_create", endpoint, "created", after=_public(endpoint))
    return EndpointWithSecret(
        endpoint, signing_secret(endpoint_id=endpoint.id, salt=endpoint.secret_salt)
    )


def endpoint_current_secret(endpoint: WebhookEndpoint) -> str:
    """The secret that signs today: only for a replay of the keyed request that made it
    (create or rotate), whose first answer its caller may not have read."""
    return signing_secret(endpoint_id=endpoint.id, salt=endpoint.secret_salt)


def endpoint_update(
    *,
    endpoint: WebhookEndpoint,
    actor: str,
    url: str | None = None,
    event_types: list[str] | None = None,
    description: str | None = None,
    enabled: bool | None = None,
    reason: str = "",
) -> WebhookEndpoint:
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        if endpoint.kind != EndpointKind.STANDARD and (url is not None or event_types is not None):
            raise EndpointError("an ACP platform's webhook URL is set with acp_platform")
        before = _public(endpoint)
        fields = ["updated_at"]
        if url is not None:
            endpoint.url = _url(url)
            fields.append("url")
        if event_types is not None:
            endpoint.event_types = _types(event_types)
            fields.append("event_types")
        if description is not None:
            endpoint.description = description[:200]
            fields.append("description")
        if enabled is not None and enabled != endpoint.enabled:
            endpoint.enabled = enabled
            endpoint.disabled_at = None if enabled else timezone.now()
            endpoint.disabled_reason = "" if enabled else (reason or f"disabled by {actor}")[:200]
            endpoint.failing_since = None  # a fresh start either way
            fields += ["enabled", "disabled_at", "disabled_reason", "failing_since"]
        endpoint.save(update_fields=fields)
        _audit(
            actor,
            "webhook_endpoint_update",
            endpoint,
            reason,
            before=before,
            after=_public(endpoint),
        )
        if enabled:
            deliver_kick()  # what waited while it was off goes now
    return endpoint


def endpoint_rotate_secret(
    *, endpoint: WebhookEndpoint, actor: str, overlap_seconds: int = 86400, reason: str = ""
) -> EndpointWithSecret:
    """A new secret signs from now on; the old one signs too for `overlap_seconds`."""
    if not 0 <= overlap_seconds <= MAX_ROTATION_OVERLAP_SECONDS:
        raise EndpointError(f"overlap_seconds must be 0..{MAX_ROTATION_OVERLAP_SECONDS}")
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        if endpoint.kind != EndpointKind.STANDARD:
            raise EndpointError("an ACP platform's secret is set with acp_platform")
        now = timezone.now()
        endpoint.previous_secret_salt = endpoint.secret_salt if overlap_seconds else ""
        endpoint.previous_secret_expires_at = (
            now + timedelta(seconds=overlap_seconds) if overlap_seconds else None
        )
        endpoint.secret_salt = new_secret_salt()
        endpoint.save(
            update_fields=[
                "previous_secret_salt",
                "previous_secret_expires_at",
                "secret_salt",
                "updated_at",
            ]
        )
        _audit(
            actor,
            "webhook_endpoint_rotate_secret",
            endpoint,
            reason,
            after={"overlap_seconds": overlap_seconds},
        )
    return EndpointWithSecret(
        endpoint, signing_secret(endpoint_id=endpoint.id, salt=endpoint.secret_salt)
    )


def endpoint_delete(*, endpoint: WebhookEndpoint, actor: str, reason: str = "") -> None:
    with transaction.atomic():
        _audit(actor, "webhook_endpoint_delete", endpoint, reason, before=_public(endpoint))
        endpoint.delete()


def delivery_resend(*, delivery: WebhookDelivery, actor: str, reason: str = "") -> None:
    """Send an event to its endpoint again (same webhook-id: a deduping receiver takes it
    once), with a fresh retry window. A message without an event (an ACP order event: a
    whole state, no sequence) is refused once a later message of its purchase was put on
    the endpoint: resent, it would be the receiver's last word about an order whose state
    moved on (`confirmed` after `refunded`); the later one is the one to resend."""
    if delivery.event_id is None and (
        WebhookDelivery.objects.filter(
            endpoint_id=delivery.endpoint_id,
            purchase_id=delivery.purchase_id,
            event__isnull=True,
            id__gt=delivery.id,
        ).exists()
    ):
        raise EndpointError(
            "a later order event of this purchase exists; resend that one, not this one"
        )
    now = timezone.now()
    with transaction.atomic():
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            state=DeliveryState.PENDING,
            next_attempt_at=now,
            claimed_until=None,
            give_up_at=now + timedelta(seconds=settings.WEBHOOK_RETRY_SECONDS),
        )
        audit_write(
            actor=actor,
            action="webhook_delivery_resend",
            target_type="webhook_delivery",
            target_id=str(delivery.pk),
            purchase_id=delivery.purchase_id,
            reason=reason or "resend",
        )
        deliver_kick()


def events_prune(*, batch: int = 5000) -> int:
    """Delete events older than EVENTS_RETENTION_DAYS (their deliveries and attempts go with
    them) and ACP order-event deliveries as old, a batch at a time; the feed answers only
    for what is kept (docs/events.md)."""
    cutoff = timezone.now() - timedelta(days=settings.EVENTS_RETENTION_DAYS)
    ids = list(
        Event.objects.filter(created_at__lt=cutoff)
        .order_by("id")
        .values_list("id", flat=True)[:batch]
    )
    # Messages of other kinds (ACP order events) have no event to go with: theirs is
    # the same retention, counted from when they were put.
    messages = list(
        WebhookDelivery.objects.filter(event__isnull=True, created_at__lt=cutoff)
        .order_by("id")
        .values_list("id", flat=True)[:batch]
    )
    if not ids and not messages:
        return 0
    with transaction.atomic():
        Event.objects.filter(id__in=ids).delete()
        WebhookDelivery.objects.filter(id__in=messages).delete()
    return len(ids) + len(messages)
