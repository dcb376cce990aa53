"""Delivering storefront events to webhook endpoints: at least once, signed per the
Standard Webhooks spec with the `standardwebhooks` package, retried with backoff for
WEBHOOK_RETRY_SECONDS.

  1. fan-out (an outbox handler, EVENT_FANOUT): one WebhookDelivery per enabled endpoint
     of the event's API client that wants its type (INSERT … ON CONFLICT DO NOTHING), then
     a kick of the delivery task after commit;
  2. claim (`events.deliver_due`, its own task: a slow receiver never holds the outbox
     relay, so it never delays a money path): one short transaction, serialised by an
     advisory lock, takes due deliveries within each endpoint's `max_in_flight` and at
     most one per (endpoint, purchase) at a time, so a purchase's events leave in their
     sequence order; stamps a lease and reads the rows with their event and endpoint;
  3. send with no transaction open, side by side (one thread per delivery);
  4. settle the batch in one transaction: delivered, or the next attempt's time from the
     schedule; past the retry window the delivery fails, and an endpoint that has failed
     everything for WEBHOOK_DISABLE_AFTER_SECONDS is disabled with its reason (console
     queue, metric). The next batch's claim runs in the same transaction.
The `webhooks` halt stops step 2: deliveries wait, they do not fail.

Endpoints of another kind take the same path (one claim, retry schedule, disabling rule
and log): an ACP agent platform's order webhook (`EndpointKind.ACP`) is a delivery put by
`message_delivery_create` with its own message id and body, signed by the headers its kind
registered (`kind_signer_register`, from acp): its ACP shape and `Merchant-Signature` kept.
A worker that dies between 2 and 4 leaves the lease; the next claim after it takes the
delivery again (the receiver dedupes on `webhook-id`, the event's id).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    Case,
    Exists,
    F,
    OuterRef,
    PositiveSmallIntegerField,
    Q,
    QuerySet,
    Value,
    When,
)
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from payments.locks import assert_outside_transaction
from recovery.kick import relay_kick_coalesced
from recovery.models import OutboxCategory, WorkflowHalt
from recovery.outbox import outbox_handler

from .destinations import PostResult, post_checked
from .models import (
    DeliveryState,
    EndpointKind,
    Event,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from .secrets import signing_secret
from .selectors import event_document

log = logging.getLogger("verity.events")

DELIVER_TASK = "events.deliver_due"
HALT = "webhooks"


# -- 1. fan-out -------------------------------------------------------------------------


@outbox_handler(OutboxCategory.EVENT_FANOUT)
def _fan_out(payload: dict) -> None:
    event = Event.objects.filter(pk=payload["event"]).first()
    if event is None or not event.api_client_id:
        return  # pruned, or a purchase no API client owns: nobody to tell
    endpoints = [
        e
        for e in WebhookEndpoint.objects.filter(
            api_client_id=event.api_client_id, enabled=True, kind=EndpointKind.STANDARD
        )
        if e.wants(event.type)
    ]
    if not endpoints:
        return
    now = timezone.now()
    with transaction.atomic():
        WebhookDelivery.objects.bulk_create(
            [
                WebhookDelivery(
                    endpoint=e,
                    event=event,
                    purchase_id=event.purchase_id,
                    next_attempt_at=now,
                    give_up_at=now + timedelta(seconds=settings.WEBHOOK_RETRY_SECONDS),
                )
                for e in endpoints
            ],
            ignore_conflicts=True,
        )  # a redelivered message adds nothing
        deliver_kick()


def message_delivery_create(
    *, endpoint: WebhookEndpoint, message_id: str, purchase_id: str, body: bytes
) -> bool:
    """Put one message of a non-event kind (an ACP order event) on `endpoint`'s delivery
    log, due now; from here it is retried, logged, halted and resent as an event's delivery
    is. The same `message_id` twice on one endpoint is one delivery (a redelivered outbox
    message adds nothing). Returns whether a delivery was made (False: a disabled endpoint
    takes nothing, as fan-out gives a disabled storefront endpoint nothing)."""
    if not endpoint.enabled:
        return False
    now = timezone.now()
    with transaction.atomic():
        made = WebhookDelivery.objects.bulk_create(
            [
                WebhookDelivery(
                    endpoint=endpoint,
                    message_id=message_id,
                    body=body.decode(),
                    purchase_id=purchase_id,
                    next_attempt_at=now,
                    give_up_at=now + timedelta(seconds=settings.WEBHOOK_RETRY_SECONDS),
                )
            ],
            ignore_conflicts=True,
        )
        deliver_kick()
    return bool(made)


DELIVER_KICK = "events-deliver-kick"


def _deliver_publish(countdown: float | None) -> None:
    current_app.send_task(DELIVER_TASK, countdown=countdown, retry=False)


def deliver_kick() -> None:
    """After commit, ask a worker to send what is due (the beat sweep is the backstop).
    Coalesced as the relay's kicks are (recovery.kick: at most two publishes per window,
    each starting after the commits it covers): one run sends every due delivery, so a
    burst of N events is not N runs that each find the first one's work done."""
    transaction.on_commit(
        lambda: relay_kick_coalesced(_deliver_publish, name=DELIVER_KICK), robust=True
    )


# -- 2. claim ---------------------------------------------------------------------------

_CLAIM_LOCK = 0x5645524954  # "VERIT": pg_advisory_xact_lock key of the delivery claim


def _claim_lock() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CLAIM_LOCK])


def _earlier_message_owed() -> QuerySet[WebhookDelivery]:
    """For a message without an event (an ACP order event: the order's whole state, no
    sequence, its `Timestamp` the attempt's): an earlier message of the same purchase to
    the same endpoint still owed (pending, in flight or waiting for its retry). The later
    one waits for it, so the receiver's last word is the purchase's latest (never
    `confirmed` after `refunded`) and every message still arrives. Event deliveries carry
    their sequence: a receiver orders those itself."""
    return WebhookDelivery.objects.filter(
        endpoint_id=OuterRef("endpoint_id"),
        purchase_id=OuterRef("purchase_id"),
        event__isnull=True,
        state=DeliveryState.PENDING,
        id__lt=OuterRef("id"),
    )


def _claim(batch: int, *, locked: bool = False) -> list[WebhookDelivery]:
    """Take up to `batch` due deliveries, stamp their lease and read them with their event
    and endpoint. Nothing while the `webhooks` halt is set: it is read
    in this transaction, so a halt bites at the next claim. Runs in its own transaction, or
    in the caller's (the settle of the batch before: one commit for both)."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.WEBHOOK_LEASE_SECONDS)
    # No savepoint inside the settle's transaction: two statements fewer, and a failed
    # claim there undoes the settle too (its deliveries are sent again: at least once).
    with transaction.atomic(savepoint=False):
        if not locked:
            # Claims are short and rare next to sends: one at a time keeps each endpoint's
            # in-flight count exact without a counter that a dead worker would leak.
            _claim_lock()
        # What is in flight, read once: per endpoint (its bound) and per (endpoint,
        # purchase) (one at a time: its events leave in order).
        in_flight = list(
            WebhookDelivery.objects.filter(
                state=DeliveryState.PENDING, claimed_until__gt=now
            ).values_list("endpoint_id", "purchase_id")
        )
        busy = Counter(endpoint_id for endpoint_id, _ in in_flight)
        busy_pairs = set(in_flight)
        due = (
            WebhookDelivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))
            .exclude(Q(event__isnull=True) & Exists(_earlier_message_owed()))
        )
        # Endpoint by endpoint, each read only as far as its free room: an endpoint with a
        # long backlog and a full in-flight bound takes no place in anyone else's claim
        # (one global "oldest first" read would put its backlog in front of everyone).
        # A halt answers no endpoint (the halt's row is read in this statement).
        bounds = list(
            WebhookEndpoint.objects.filter(enabled=True, id__in=due.values("endpoint_id"))
            .filter(~Exists(WorkflowHalt.objects.filter(name=HALT)))
            .values_list("id", "max_in_flight")
        )
        random.shuffle(bounds)  # no endpoint always first when the batch fills up
        picked: list[int] = []
        for endpoint_id, bound in bounds:
            room = min(bound - busy.get(endpoint_id, 0), batch - len(picked))
            if room <= 0:
                continue
            rows = (
                due.filter(endpoint_id=endpoint_id)
                .order_by("event_id", "id")
                .values_list("id", "purchase_id")[: room * 4 + 8]
            )
            for delivery_id, purchase_id in rows:
                if (endpoint_id, purchase_id) in busy_pairs:
                    continue  # one at a time per purchase: its events leave in order
                picked.append(delivery_id)
                busy_pairs.add((endpoint_id, purchase_id))
                room -= 1
                if room <= 0:
                    break
            if len(picked) >= batch:
                break
        if not picked:
            return []
        WebhookDelivery.objects.filter(id__in=picked).update(claimed_until=lease)
        # Only the picked rows are read whole (an event's data is the purchase view): in
        # this transaction, so the claim and its rows are one commit.
        deliveries = list(
            WebhookDelivery.objects.select_related("event", "endpoint")
            .filter(id__in=picked)
            .order_by("id")
        )
    return deliveries


# -- 3. send ----------------------------------------------------------------------------


def event_body(event: Event) -> bytes:
    """The JSON a receiver gets (docs/events.md): the feed's document, the same for every
    attempt."""
    return json.dumps(event_document(event), separators=(",", ":")).encode()


def signed_headers(
    endpoint: WebhookEndpoint, *, msg_id: str, body: bytes, at: datetime
) -> dict[str, str]:
    """Standard Webhooks headers. While a rotation's overlap lasts, the old secret signs
    too (a second `v1,` signature): a receiver with either secret verifies."""
    salts = [endpoint.secret_salt]
    if (
        endpoint.previous_secret_salt
        and endpoint.previous_secret_expires_at
        and endpoint.previous_secret_expires_at > at
    ):
        salts.append(endpoint.previous_secret_salt)
    text = body.decode()
    signatures = [
        Webhook(signing_secret(endpoint_id=endpoint.id, salt=salt)).sign(
            msg_id=msg_id, timestamp=at, data=text
        )
        for salt in salts
    ]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": " ".join(signatures),
    }


# (message id, body, signing time) -> the headers that sign it
Signer = Callable[[str, bytes, datetime], dict[str, str]]
# An endpoint kind's signer, made once per endpoint per batch in the claiming thread (it
# may read the database; what it returns must not); None: nothing can sign for it now.
SignerFactory = Callable[[WebhookEndpoint], Signer | None]
_KIND_SIGNERS: dict[str, SignerFactory] = {}


def kind_signer_register(kind: str, factory: SignerFactory) -> None:
    """How an endpoint of `kind` is signed (acp registers its `Merchant-Signature`)."""
    _KIND_SIGNERS[kind] = factory


def _signer(endpoint: WebhookEndpoint) -> Signer | None:
    if endpoint.kind == EndpointKind.STANDARD:
        return lambda msg_id, body, at: signed_headers(endpoint, msg_id=msg_id, body=body, at=at)
    factory = _KIND_SIGNERS.get(endpoint.kind)
    return factory(endpoint) if factory is not None else None


def delivery_body(delivery: WebhookDelivery) -> bytes:
    return event_body(delivery.event) if delivery.event is not None else delivery.body.encode()


def _send(delivery: WebhookDelivery, signer: Signer | None) -> PostResult:
    if signer is None:
        return PostResult(None, f"refused: no signer for a {delivery.endpoint.kind} endpoint", 0)
    body = delivery_body(delivery)
    headers = signer(delivery.msg_id, body, timezone.now())
    return post_checked(delivery.endpoint.url, body=body, headers=headers)


# -- 4. settle --------------------------------------------------------------------------


def retry_delay_seconds(attempts: int) -> float:
    schedule = settings.WEBHOOK_RETRY_SCHEDULE_SECONDS
    return float(schedule[min(max(attempts, 1), len(schedule)) - 1])


def _settle_all(
    settled: list[tuple[WebhookDelivery, PostResult]], *, claim_next: int = 0
) -> list[WebhookDelivery]:
    """Record a batch's answers in one transaction: the attempt log in one INSERT, the
    delivered ones in one UPDATE; a failure is scheduled (or given up) row by row. With
    `claim_next`, the next batch is claimed in the same transaction (one commit for both:
    what this settles is no longer in flight for that claim) and returned."""
    now = timezone.now()
    with transaction.atomic():
        if claim_next:
            # Taken first, before this settle's row locks: a claimer then never waits on a
            # row lock while holding it (a row a lapsed lease lets it pick could be one
            # this settle holds), so the two cannot wait on each other.
            _claim_lock()
        WebhookAttempt.objects.bulk_create(
            [
                WebhookAttempt(
                    delivery_id=d.id,
                    status_code=r.status,
                    error=_error(r)[:300],
                    duration_ms=r.duration_ms,
                    at=now,
                )
                for d, r in settled
            ]
        )
        ok = [d for d, r in settled if r.ok]
        if ok:
            WebhookDelivery.objects.filter(
                id__in=[d.id for d in ok], state=DeliveryState.PENDING
            ).update(
                state=DeliveryState.DELIVERED,
                delivered_at=now,
                claimed_until=None,
                attempts=F("attempts") + 1,
                last_error="",
                last_status=Case(
                    *[When(id=d.id, then=Value(r.status)) for d, r in settled if r.ok],
                    output_field=PositiveSmallIntegerField(),
                ),
            )
            # Always asked (not only when the claim's read saw it failing): another
            # worker's failure may have set it since, and a success left behind it would
            # let the endpoint be disabled for failures this success interrupted.
            WebhookEndpoint.objects.filter(
                id__in={d.endpoint_id for d in ok}, failing_since__isnull=False
            ).update(failing_since=None)
        for delivery, result in settled:
            if not result.ok:
                _failed(delivery, result, now)
        return _claim(claim_next, locked=True) if claim_next else []


def _error(result: PostResult) -> str:
    return result.error or (f"answered {result.status}" if result.status else "")


def _failed(delivery: WebhookDelivery, result: PostResult, now: datetime) -> None:
    error = _error(result)
    attempts = delivery.attempts + 1
    next_at = now + timedelta(seconds=retry_delay_seconds(attempts))
    gave_up = next_at > delivery.give_up_at
    WebhookDelivery.objects.filter(id=delivery.id, state=DeliveryState.PENDING).update(
        state=DeliveryState.FAILED if gave_up else DeliveryState.PENDING,
        attempts=F("attempts") + 1,
        next_attempt_at=next_at,
        claimed_until=None,
        last_status=result.status,
        last_error=error[:300],
    )
    WebhookEndpoint.objects.filter(id=delivery.endpoint_id, failing_since__isnull=True).update(
        failing_since=now
    )
    cutoff = now - timedelta(seconds=settings.WEBHOOK_DISABLE_AFTER_SECONDS)
    disabled = WebhookEndpoint.objects.filter(
        id=delivery.endpoint_id, enabled=True, failing_since__lte=cutoff
    ).update(
        enabled=False,
        disabled_at=now,
        disabled_reason="every delivery failed since "
        f"{cutoff:%Y-%m-%d %H:%M} UTC or earlier (last: {error[:80]})",
    )
    if disabled:
        log.warning("webhook endpoint disabled endpoint=%s reason=failing", delivery.endpoint_id)


_SENDERS: ThreadPoolExecutor | None = None
_SENDERS_LOCK = threading.Lock()


def _senders() -> ThreadPoolExecutor:
    """The process's sending threads, made once (a pool per batch cost a thread start per
    delivery). HTTP only: no database in them."""
    global _SENDERS
    with _SENDERS_LOCK:
        if _SENDERS is None:
            _SENDERS = ThreadPoolExecutor(
                max(1, settings.WEBHOOK_SEND_THREADS), thread_name_prefix="webhook-send"
            )
        return _SENDERS


def _send_batch(deliveries: list[WebhookDelivery]) -> list[PostResult]:
    """Send a claimed batch side by side, no transaction open; signers are made here, in
    the calling thread (a kind's signer may read its secret from the database)."""
    endpoints = {d.endpoint_id: d.endpoint for d in deliveries}
    signers = {endpoint_id: _signer(e) for endpoint_id, e in endpoints.items()}
    signed = [signers[d.endpoint_id] for d in deliveries]
    if len(deliveries) <= 1 or settings.WEBHOOK_SEND_THREADS <= 1:
        return [_send(d, s) for d, s in zip(deliveries, signed, strict=True)]
    return list(_senders().map(_send, deliveries, signed))


def deliveries_send_due(*, batch: int = 20) -> int:
    """Claim, send and settle one batch; returns how many were sent."""
    assert_outside_transaction()
    deliveries = _claim(batch)
    if not deliveries:
        return 0
    _settle_all(list(zip(deliveries, _send_batch(deliveries), strict=True)))
    return len(deliveries)


def deliveries_send_run(*, max_batches: int = 50, batch: int = 20) -> tuple[int, bool]:
    """Batches until nothing is due or `max_batches` were sent: each batch's settle and the
    next batch's claim share one transaction. Returns (how many were sent, whether it
    stopped at `max_batches` with more perhaps due)."""
    assert_outside_transaction()
    total = 0
    deliveries = _claim(batch)
    for n in range(max_batches):
        if not deliveries:
            return total, False
        results = _send_batch(deliveries)
        total += len(deliveries)
        deliveries = _settle_all(
            list(zip(deliveries, results, strict=True)),
            claim_next=batch if n + 1 < max_batches else 0,
        )
    return total, True


def deliveries_send_all_due(*, max_batches: int = 50, batch: int = 20) -> int:
    return deliveries_send_run(max_batches=max_batches, batch=batch)[0]


def next_retry_in() -> float | None:
    """Seconds until the soonest pending delivery is due, when that is sooner than the
    beat's next sweep (WEBHOOK_SWEEP_SECONDS); None when nothing is pending that soon."""
    horizon = float(getattr(settings, "WEBHOOK_SWEEP_SECONDS", 5.0))
    now = timezone.now()
    # Only retries due LATER: a row due now that this run did not send is claimed by another
    # sender, held by a halt or waiting on its endpoint's in-flight bound: the sweep takes
    # it, and a run rescheduled for it would spin.
    soonest = (
        WebhookDelivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__gt=now)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    if soonest is None:
        return None
    wait = (soonest - now).total_seconds() + 0.05
    return wait if wait <= horizon else None
