"""The storefront's `Idempotency-Key` contract (see
docs/walkthrough.md#api-rules-the-code-relies-on).

Scope: (API client, route name). The first request inserts its record with one
`INSERT … ON CONFLICT DO NOTHING RETURNING id` (no read-then-write: two racing requests
cannot both win), state `in_flight` with a lease. Then:

- same key, same canonical body, record `done`  -> replay: 200 with the resource's
  *current* state and `Idempotent-Replayed: true`;
- same key, different body                     -> 422 `idempotency_key_reused`;
- same key, in flight, lease running           -> 409 `request_in_progress` + Retry-After;
- same key, in flight, lease expired           -> the request is taken over (a crashed
  request's key is not stuck forever); the record's bound resource, if any, is resumed.

Fencing: the lease a request was granted (`lease_until` at its claim or take-over) is its
token. Binding an effect, completing and releasing the key compare-and-set on it, and the
binding runs in the transaction that creates the effect: a request whose lease ran out and
whose key was taken over creates nothing (its transaction rolls back), however long it
stalled before.

A refusal made before any effect deletes the record so it does not bind the key. Once
the effect exists the record names it (`resource_type`, `resource_id`) and is never
deleted by a refusal again.

The provider never sees this key: operations carry their own server-generated keys.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Subquery
from django.utils import timezone

from ..enums import RetryAdvice
from ..errors import ErrorCode
from ..models import ApiClient, IdempotencyRecord, PaymentOperation
from ..view_queries import CompiledRead, operations_for_view
from .problems import Problem

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
REPLAYED_HEADER = "Idempotent-Replayed"


def canonical_json(data) -> str:
    """Key order and whitespace do not matter; values and types do."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_fingerprint(*, path: str, body) -> str:
    # The route name is the scope; the concrete path (which purchase, which operation) is
    # part of the request, so one key reused for another purchase is a different request.
    return hashlib.sha256(f"{path}\n{canonical_json(body)}".encode()).hexdigest()


def key_from_headers(headers) -> str:
    key = (headers.get(HEADER) or "").strip()
    if not key:
        raise Problem(
            code=ErrorCode.IDEMPOTENCY_KEY_REQUIRED, status=400, retry=RetryAdvice.SAME_KEY,
            detail=f"This request creates an effect: send an {HEADER} header (a unique "
                   "value per intended effect, reused only to retry that same request).",
            action_message=f"Generate one {HEADER} for this intent, send it, and reuse it "
                           "only when retrying this exact request.")
    if len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise Problem(code=ErrorCode.INVALID_REQUEST, status=400,
                      detail=f"{HEADER} must be 1-{MAX_KEY_LENGTH} printable characters.")
    return key


@dataclass
class Claim:
    record: IdempotencyRecord
    replay: bool = False       # a finished request: answer with the resource's current state
    taken_over: bool = False   # the previous holder's lease expired; resume its resource
    token: object = None       # the lease this request was granted: its fencing token

    @property
    def resource_id(self) -> str:
        return self.record.resource_id


def _lease_until():
    return timezone.now() + timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS)


def _insert_unsafe(*, api_client: ApiClient, route: str, key: str, fingerprint: str,
                   lease_until):
    """INSERT … ON CONFLICT DO NOTHING RETURNING id -> new id, or None if the key exists.

    bulk_create(ignore_conflicts=True) cannot tell us whether *this* request inserted the
    row (no id comes back on conflict), which is the whole point; hence one raw statement.
    """
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    q = connection.ops.quote_name
    now = timezone.now()
    sql = (
        f"INSERT INTO {table} ({q('api_client_id')}, {q('route')}, {q('key')}, "
        f"{q('fingerprint')}, {q('state')}, {q('lease_until')}, {q('resource_type')}, "
        f"{q('resource_id')}, {q('created_at')}) "
        f"VALUES (%s, %s, %s, %s, %s, %s, '', '', %s) "
        f"ON CONFLICT ({q('api_client_id')}, {q('route')}, {q('key')}) DO NOTHING "
        f"RETURNING {q('id')}"
    )
    with connection.cursor() as cursor:
        # Datetimes through the backend's adapter, as the ORM stores them (SQLite: text).
        adapt = connection.ops.adapt_datetimefield_value
        cursor.execute(sql, [api_client.pk, route, key, fingerprint,
                             IdempotencyRecord.State.IN_FLIGHT, adapt(lease_until),
                             adapt(now)])
        row = cursor.fetchone()
    return row[0] if row else None


def idempotency_claim(*, api_client: ApiClient, route: str, key: str, path: str, body) -> Claim:
    """Claim the key for this request, or raise the Problem the contract prescribes."""
    fingerprint = request_fingerprint(path=path, body=body)
    for _ in range(5):
        # Read first (one indexed read of the unique key): a replay — the common case for
        # an agent that retries — costs no INSERT. Absent: the INSERT decides the race.
        record = next(iter(IdempotencyRecord.objects.filter(
            api_client=api_client, route=route, key=key)[:1]), None)  # unique: no ORDER BY
        if record is None:
            lease = _lease_until()
            new_id = _insert_unsafe(api_client=api_client, route=route, key=key,
                                    fingerprint=fingerprint, lease_until=lease)
            if new_id is not None:
                record = IdempotencyRecord.objects.get(pk=new_id)
                return Claim(record=record, token=record.lease_until)
            continue  # inserted by a racing request between our read and insert: read it
        if record.fingerprint != fingerprint:
            raise Problem(
                code=ErrorCode.IDEMPOTENCY_KEY_REUSED, status=422, retry=RetryAdvice.FORBIDDEN,
                detail=f"This {HEADER} was already used for a different request body. "
                       "A key names one intended effect; changing the body does not make "
                       "it a new request.",
                action_message="If this is a new intent, use a new key; if it is a retry, "
                               "send the original body unchanged.",
                extra={"resource": _resource_ref(record)})
        if record.state == IdempotencyRecord.State.DONE:
            return Claim(record=record, replay=True)
        now = timezone.now()
        if record.lease_until > now:
            wait = max(1, math.ceil((record.lease_until - now).total_seconds()))
            raise Problem(
                code=ErrorCode.REQUEST_IN_PROGRESS, status=409, retry=RetryAdvice.SAME_KEY,
                detail="A request with this Idempotency-Key is still being processed.",
                action_message=f"Wait {wait} s and send the same request with the same key; "
                               "do not use a new key.",
                headers={"Retry-After": str(wait)}, extra={"resource": _resource_ref(record)})
        # The holder's lease expired (it crashed or hung): compare-and-set takes it over.
        # The new lease is later than the old one, so the old holder's token no longer
        # matches: whatever it still tries to bind, complete or release is refused.
        lease = _lease_until()
        taken = IdempotencyRecord.objects.filter(
            pk=record.pk, state=IdempotencyRecord.State.IN_FLIGHT,
            lease_until=record.lease_until,
        ).update(lease_until=lease)
        if taken:
            record.refresh_from_db()
            return Claim(record=record, taken_over=True, token=record.lease_until)
    raise Problem(code=ErrorCode.REQUEST_IN_PROGRESS, status=409, retry=RetryAdvice.SAME_KEY,
                  detail="A request with this Idempotency-Key is still being processed.",
                  headers={"Retry-After": "1"})


# Compiled once per process, a prepared statement on PostgreSQL (payments.view_queries).
_REPLAY_READ = CompiledRead(
    lambda client_id, route, key: IdempotencyRecord.objects.filter(
        api_client_id=client_id, route=route, key=key,
    ).values_list("state", "fingerprint", "resource_type", "resource_id")[:1],
    "\x01verity-client", "\x01verity-route", "\x01verity-key")


def idempotency_replay_of(*, api_client: ApiClient, route: str, key: str, path: str, body
                          ) -> IdempotencyRecord | None:
    """The record when this request is a replay (record `done`, same fingerprint), else
    None — then the caller goes through `idempotency_claim`, which decides every other case
    (new, 422 reused, 409 in flight, take-over) exactly as before.

    Asked first, before the purchase read and the body's validation, because a
    replay needs neither: the original request with this very body and path passed both
    for this client (a record is scoped by client and route), so their answers cannot
    differ now. One indexed read of the unique key, its four needed columns only."""
    found = _REPLAY_READ.rows(api_client.pk, route, key)
    row = found[0] if found else None
    if row is None or row[0] != IdempotencyRecord.State.DONE or not row[3]:
        return None
    if not hmac.compare_digest(row[1], request_fingerprint(path=path, body=body)):
        return None
    return IdempotencyRecord(api_client_id=api_client.pk, route=route, key=key,
                             state=row[0], fingerprint=row[1], resource_type=row[2],
                             resource_id=row[3])


def _replayed_operation_query(client_id, route, key):
    record = IdempotencyRecord.objects.filter(api_client_id=client_id, route=route, key=key)
    done = record.filter(state=IdempotencyRecord.State.DONE, resource_type="operation")
    # One unique-index lookup each; the fingerprint is compared here, in constant time.
    return (operations_for_view()
            .filter(pk=Subquery(done.values("resource_id")[:1]))
            .annotate(view_replay_fingerprint=Subquery(record.values("fingerprint")[:1]))[:1])


# A replayed payment: the record and the operation view in ONE statement (prepared on
# PostgreSQL), so a replay costs one database round trip.
_REPLAYED_OPERATION = CompiledRead(_replayed_operation_query, "\x01verity-client",
                                   "\x01verity-route", "\x01verity-key")


def idempotency_replayed_operation(*, api_client: ApiClient, route: str, key: str,
                                   path: str, body) -> PaymentOperation | None:
    """The operation (loaded for payments.api.presenters.operation_view) when this request
    replays a finished one that created it — record `done`, resource an operation, same
    fingerprint — else None, and the caller goes through `idempotency_claim`, as
    `idempotency_replay_of`."""
    found = _REPLAYED_OPERATION.instances(api_client.pk, route, key)
    if not found:
        return None
    op = found[0]
    if not hmac.compare_digest(op.__dict__.pop("view_replay_fingerprint") or "",
                               request_fingerprint(path=path, body=body)):
        return None
    return op


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


def _held(claim: Claim):
    """The record while this request still holds it (its fencing token matches)."""
    return IdempotencyRecord.objects.filter(
        pk=claim.record.pk, state=IdempotencyRecord.State.IN_FLIGHT, lease_until=claim.token)


def idempotency_bind(claim: Claim, *, resource_type: str, resource_id: str) -> None:
    """Name the effect. Call in the same transaction that creates it: when another request
    took the key over meanwhile, this raises and the effect's transaction rolls back."""
    if not _held(claim).update(resource_type=resource_type, resource_id=resource_id):
        raise Problem(
            code=ErrorCode.REQUEST_IN_PROGRESS, status=409, retry=RetryAdvice.SAME_KEY,
            detail="This request's hold on its Idempotency-Key ran out and a retry took the "
                   "key over; this request did nothing.",
            action_message="Send the same request with the same key to see the answer of "
                           "the request that holds it; do not use a new key.",
            headers={"Retry-After": "1"})
    claim.record.resource_type = resource_type
    claim.record.resource_id = resource_id


def idempotency_complete(claim: Claim, *, status: int) -> None:
    """Mark the key done; a no-op for a request that no longer holds it (the holder's
    answer stands)."""
    _held(claim).update(state=IdempotencyRecord.State.DONE, response_status=status)
    claim.record.state = IdempotencyRecord.State.DONE
    claim.record.response_status = status


def idempotency_release(claim: Claim) -> None:
    """A refusal before any effect: the key stays free for a corrected request (only while
    this request still holds it: never the key of the request that took it over)."""
    _held(claim).filter(resource_id="").delete()


def _resource_ref(record: IdempotencyRecord) -> dict | None:
    if not record.resource_id:
        return None
    return {"type": record.resource_type, "id": record.resource_id}


__all__ = [
    "HEADER", "REPLAYED_HEADER", "Claim", "canonical_json", "idempotency_bind",
    "idempotency_claim", "idempotency_complete", "idempotency_release",
    "idempotency_replay_of", "idempotency_replayed_operation", "key_from_headers", "replay_body",
    "request_fingerprint",
]
