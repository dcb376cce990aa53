"""One keyed request around one effect, for every face (REST, MCP, ACP).

The ladder, in this order, written once (`keyed_effect`):

1. claim the Idempotency-Key (scope: API client + route; the first request inserts its
   record with one `INSERT … ON CONFLICT DO NOTHING RETURNING id`, state `in_flight` with a
   lease): another body under the key -> `idempotency_key_reused`; in flight with its lease
   running -> `request_in_progress` (`retry_after`);
2. replay when done: nothing is done again, the face answers (REST: the resource's current
   state; ACP: what the first request answered, stored with the key — `answer`);
3. take over a dead request (its lease expired, compare-and-set on the lease): a resource it
   bound is resumed (dispatched when pending), never created twice;
4. read back a person's word (`verify`, outside any transaction: network I/O) before a
   follow-up money movement decides on it;
5. create the effect and bind the key in one transaction, fenced: the lease a request was
   granted is its token, and the binding compare-and-sets on it, so a request whose lease
   ran out and whose key was taken over meanwhile creates nothing (its transaction rolls
   back), however long it stalled (inside the effect's change batch the binding joins the
   batch's last statement and raises from there);
6. dispatch the effect's operation when it is pending (no transaction open), or send the
   one the effect created already claimed for its send (`Created.send`: a one-call
   payment, its claim committed with it);
7. complete the key (done, with the status its effect means: in the transaction that
   applies the answer to the operation this request sent, when one does —
   `key_complete_with_apply` — else after the send), or release it when nothing
   was created (a refusal before any effect leaves the key free for a corrected request).
   A refusal after the effect exists completes the key (bound to it for good); a crash
   after it keeps the lease, so the same key resumes the effect once the lease expires.
   A face that stores its answers (ACP) stores its refusals too, and never a 5xx: that
   key is forgotten, and the same key is processed afresh.

The faces only parse input and render a `Keyed` (a problem document, an MCP result, an
ACP object): tests/api/test_keyed_faces.py keeps them from growing their own ladder.
The provider never sees this key: operations carry their own server-generated keys.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Subquery
from django.utils import timezone

from recovery.outbox import JoinedWrite, outbox_joined_name, outbox_write_joined, row_update_sql

from .enums import PAYMENT_KINDS, Outcome, RetryAdvice
from .errors import DomainError, ErrorCode
from .locks import assert_outside_transaction
from .models import ApiClient, IdempotencyRecord, PaymentOperation
from .view_queries import CompiledRead, operation_for_view, operations_for_view

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


def _refusal(
    code: ErrorCode, status: int, retry: str, detail: str, action: str, **extra
) -> DomainError:
    """A key refusal; `action_message` and `retry_after` are rendered by each face (the
    REST problem's next_action and Retry-After, the ACP error's headers)."""
    return DomainError(
        code, detail, status=status, retry=retry, extra={"action_message": action, **extra}
    )


@dataclass
class Claim:
    record: IdempotencyRecord
    replay: bool = False  # a finished request: nothing is done again
    taken_over: bool = False  # the previous holder's lease expired; resume its resource
    token: datetime | None = None  # the lease this request was granted: its fencing token
    # Completed by the transaction that applied its effect's answer (key_complete_with_apply)
    completed: bool = False

    @property
    def resource_id(self) -> str:
        return self.record.resource_id


def _lease_until():
    return timezone.now() + timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS)


def _insert_unsafe(
    *, api_client: ApiClient, route: str, key: str, fingerprint: str, lease_until: datetime
) -> tuple[IdempotencyRecord | None, bool]:
    """INSERT … ON CONFLICT DO NOTHING -> (the key's record, whether this request inserted
    it); (None, False) when a racing request's insert is not visible yet (read again).

    bulk_create(ignore_conflicts=True) cannot tell us whether *this* request inserted the
    row (no id comes back on conflict), which is the whole point; hence raw SQL. On
    PostgreSQL one statement answers both cases: the INSERT in a WITH, and the key's
    existing row read by the same statement (which cannot see its own insert, so exactly
    one of the two returns a row). SQLite takes no INSERT inside WITH: read, then insert.
    """
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    q = connection.ops.quote_name
    now = timezone.now()
    # Datetimes through the backend's adapter, as the ORM stores them (SQLite: text).
    adapt = connection.ops.adapt_datetimefield_value
    values = [
        api_client.pk,
        route,
        key,
        fingerprint,
        IdempotencyRecord.State.IN_FLIGHT,
        adapt(lease_until),
        adapt(now),
    ]
    columns = (
        f"({q('api_client_id')}, {q('route')}, {q('key')}, {q('fingerprint')}, {q('state')}, "
        f"{q('lease_until')}, {q('resource_type')}, {q('resource_id')}, {q('created_at')})"
    )
    conflict = f"ON CONFLICT ({q('api_client_id')}, {q('route')}, {q('key')}) DO NOTHING"
    scope = f"{q('api_client_id')} = %s AND {q('route')} = %s AND {q('key')} = %s"
    if connection.vendor == "postgresql":
        # The existing row is read first and the INSERT runs only when there is none: an
        # existing key (a replay, a request in flight) never reaches the unique index's
        # conflict check, which would wait for the transaction that holds its row.
        found = list(
            IdempotencyRecord.objects.raw(
                f"WITH existing AS (SELECT * FROM {table} WHERE {scope}), "
                f"ins AS (INSERT INTO {table} {columns} "
                "SELECT %s, %s, %s, %s, %s, %s, '', '', %s "
                f"WHERE NOT EXISTS (SELECT 1 FROM existing) {conflict} RETURNING *) "
                f"SELECT ins.*, TRUE AS {q('inserted_now')} FROM ins "
                "UNION ALL SELECT existing.*, FALSE FROM existing",
                [api_client.pk, route, key, *values],
            )
        )
        if not found:
            return None, False
        record = found[0]
        return record, bool(record.__dict__.pop("inserted_now"))
    insert = f"INSERT INTO {table} {columns} VALUES (%s, %s, %s, %s, %s, %s, '', '', %s) {conflict}"
    existing = next(
        iter(IdempotencyRecord.objects.filter(api_client=api_client, route=route, key=key)[:1]),
        None,
    )  # unique: no ORDER BY
    if existing is not None:
        return existing, False
    with connection.cursor() as cursor:
        cursor.execute(f"{insert} RETURNING {q('id')}", values)
        row = cursor.fetchone()
    if row is None:
        return None, False  # inserted by a racing request between our read and insert
    record = IdempotencyRecord(
        id=row[0],
        api_client_id=api_client.pk,
        route=route,
        key=key,
        fingerprint=fingerprint,
        state=IdempotencyRecord.State.IN_FLIGHT,
        lease_until=lease_until,
        created_at=now,
    )
    return record, True


def _in_progress(record: IdempotencyRecord | None, wait: int) -> DomainError:
    return _refusal(
        ErrorCode.REQUEST_IN_PROGRESS,
        409,
        RetryAdvice.SAME_KEY,
        f"A request with this {HEADER} is still being processed.",
        f"Wait {wait} s and send the same request with the same key; do not use a new key.",
        retry_after=wait,
        resource=_resource_ref(record) if record is not None else None,
    )


def key_claim(*, api_client: ApiClient, route: str, key: str, path: str, body) -> Claim:
    """Claim the key for this request (ladder steps 1-3), or raise the key's refusal."""
    fingerprint = request_fingerprint(path=path, body=body)
    for _ in range(5):
        # One statement: the key's record, inserted now when absent (the INSERT decides a
        # race between two first requests).
        record, inserted = _insert_unsafe(
            api_client=api_client,
            route=route,
            key=key,
            fingerprint=fingerprint,
            lease_until=_lease_until(),
        )
        if record is None:
            continue  # a racing request's insert, not visible to this statement: read again
        if inserted:
            return Claim(record=record, token=record.lease_until)
        if record.fingerprint != fingerprint:
            raise _refusal(
                ErrorCode.IDEMPOTENCY_KEY_REUSED,
                422,
                RetryAdvice.FORBIDDEN,
                f"This {HEADER} was already used for a different request body. A key names "
                "one intended effect; changing the body does not make it a new request.",
                "If this is a new intent, use a new key; if it is a retry, send the original "
                "body unchanged.",
                resource=_resource_ref(record),
            )
        if record.state == IdempotencyRecord.State.DONE:
            return Claim(record=record, replay=True)
        now = timezone.now()
        if record.lease_until > now:
            raise _in_progress(
                record, max(1, math.ceil((record.lease_until - now).total_seconds()))
            )
        # The holder's lease expired (it crashed or hung): compare-and-set takes it over.
        # The new lease is later than the old one, so the old holder's token no longer
        # matches: whatever it still tries to bind, complete or release is refused.
        lease_until = _lease_until()
        taken = IdempotencyRecord.objects.filter(
            pk=record.pk,
            state=IdempotencyRecord.State.IN_FLIGHT,
            lease_until=record.lease_until,
        ).update(lease_until=lease_until)
        if taken:
            record.lease_until = lease_until  # the row as this update left it
            return Claim(record=record, taken_over=True, token=lease_until)
    raise _in_progress(None, 1)


def _held(claim: Claim):
    """The record while this request still holds it (its fencing token matches)."""
    return IdempotencyRecord.objects.filter(
        pk=claim.record.pk,
        state=IdempotencyRecord.State.IN_FLIGHT,
        # A claim without a token holds nothing: `lease_until=None` (IS NULL) matches no
        # row in flight. The stubs refuse None for this column's lookups.
        lease_until=claim.token,  # type: ignore[misc]
    )


def _held_update(claim: Claim, name: str, values: dict, after: Callable[[bool], None]) -> None:
    """`_held(claim).update(**values)`, then `after(updated)`; inside an outbox batch
    (PostgreSQL) in the batch's one statement (recovery.outbox.outbox_write_joined), so in
    the transaction's last statement, `after` raising rolls that transaction back."""
    if claim.token is None:  # holds nothing (see _held)
        after(False)
        return
    sql, params = row_update_sql(
        IdempotencyRecord,
        claim.record.pk,
        values,
        where={"state": IdempotencyRecord.State.IN_FLIGHT, "lease_until": claim.token},
    )
    cte = outbox_joined_name(name)
    outbox_write_joined(
        JoinedWrite(
            ctes=((cte, f"{sql} RETURNING 1 AS held", params),),
            returning=cte,
            after=lambda rows: after(bool(rows)),
        )
    )


def key_bind(claim: Claim, *, resource_type: str, resource_id: str) -> None:
    """Name the effect. Call in the same transaction that creates it: when another request
    took the key over meanwhile, this raises and the effect's transaction rolls back.
    Inside the effect's change batch (payments.services.common.change_batch) the binding
    goes in the batch's one statement, and raises from there."""

    def bound(held: bool) -> None:
        if not held:
            raise _refusal(
                ErrorCode.REQUEST_IN_PROGRESS,
                409,
                RetryAdvice.SAME_KEY,
                f"This request's hold on its {HEADER} ran out and a retry took the key "
                "over; this request did nothing.",
                "Send the same request with the same key to see the answer of the request "
                "that holds it; do not use a new key.",
                retry_after=1,
            )
        claim.record.resource_type = resource_type
        claim.record.resource_id = resource_id

    _held_update(
        claim, "key_bind", {"resource_type": resource_type, "resource_id": resource_id}, bound
    )


def key_complete(claim: Claim, *, status: int, answer: Answer | None = None) -> None:
    """Mark the key done (with the answer itself for a face that replays it); a no-op for
    a request that no longer holds it (the holder's answer stands)."""
    stored = answer.stored() if answer is not None else None
    _held(claim).update(
        state=IdempotencyRecord.State.DONE, response_status=status, response_body=stored
    )
    claim.record.state = IdempotencyRecord.State.DONE
    claim.record.response_status = status
    claim.record.response_body = stored


_COMPLETING = threading.local()


@contextmanager
def _completed_by_apply(claim: Claim, operation_id: str | None) -> Iterator[None]:
    """While this request sends its effect's operation: the transaction that applies its
    answer completes the key too (`key_complete_with_apply`), one statement fewer."""
    if not operation_id:
        yield
        return
    _COMPLETING.pending = (claim, operation_id)
    try:
        yield
    finally:
        _COMPLETING.pending = None


def key_complete_with_apply(op: PaymentOperation) -> None:
    """Called by the transaction that applied an answer to `op` (moved its outcome),
    inside its change batch: if the request sending `op` waits to complete its key, the
    key is completed there, with the status the effect means as that transaction leaves
    it (`effect_status`) — in its last statement. Once per request."""
    pending = getattr(_COMPLETING, "pending", None)
    if pending is None or pending[1] != op.id:
        return
    claim = pending[0]
    _COMPLETING.pending = None
    status = effect_status(op.id, True, op)

    def completed(_held: bool) -> None:
        # As key_complete: a request that no longer holds the key changes nothing.
        claim.record.state = IdempotencyRecord.State.DONE
        claim.record.response_status = status
        claim.record.response_body = None
        claim.completed = True

    _held_update(
        claim,
        "key_complete",
        {"state": IdempotencyRecord.State.DONE, "response_status": status, "response_body": None},
        completed,
    )


def key_release(claim: Claim) -> None:
    """A refusal before any effect: the key stays free for a corrected request (only while
    this request still holds it: never the key of the request that took it over)."""
    _held(claim).filter(resource_id="").delete()


def key_forget(claim: Claim) -> None:
    """A 5xx answer is not stored against the key, whatever it bound (ACP §6.5): the same
    key is processed afresh, as a new request. Only while this request holds it."""
    _held(claim).delete()


def _resource_ref(record: IdempotencyRecord) -> dict | None:
    if not record.resource_id:
        return None
    return {"type": record.resource_type, "id": record.resource_id}


# -- the ladder -----------------------------------------------------------------------------


@dataclass
class Created:
    """What `create` made: the resource the key names, and the operation to dispatch."""

    resource_type: str
    resource_id: str
    operation_id: str | None = None
    created: bool = True  # False: the effect already existed (a quote's one purchase)
    # An operation created already claimed for its send (a one-call payment: its provider
    # call row and first-send time committed with it): sends it after commit, outside any
    # transaction, instead of the dispatch of a pending operation.
    send: Callable[[], object] | None = None


@dataclass
class Answer:
    """A face's answer, stored against the key when its protocol replays answers (ACP:
    "same key + identical body -> the original response with the same status code")."""

    status: int
    body: object
    headers: dict = field(default_factory=dict)

    def stored(self) -> dict:
        return {"status": self.status, "body": self.body, "headers": dict(self.headers)}


@dataclass
class Keyed:
    """What happened to a keyed request; each face renders it."""

    resource_type: str
    resource_id: str
    replayed: bool = False  # finished earlier: nothing was done now
    resumed: bool = False  # a dead request's effect, continued (nothing created now)
    created: bool = True
    operation_id: str | None = None
    extra: dict = field(default_factory=dict)
    answer: Answer | None = None  # with `keyed_effect(answer=…)`: the (stored) answer
    # The operation as this request's send left it, loaded for the operation view (None:
    # read it when needed).
    operation: PaymentOperation | None = None


@dataclass
class KeyedRequest:
    """The key as a face read it: its client, route, key and the request's identity."""

    api_client: ApiClient
    route: str
    key: str
    path: str
    body: object


def operation_of(resource_type: str, resource_id: str) -> str | None:
    return resource_id if resource_type == "operation" else None


def dispatch_when_pending(operation_id: str | None) -> PaymentOperation | None:
    """Ladder step 6: send a pending operation (claim-guarded: never sent twice; one that
    is not pending is left as it is). No transaction may be open (the provider call).
    Returns the operation as the dispatch left it, read for its view
    (payments.view_queries.operations_for_view)."""
    if not operation_id:
        return None
    assert_outside_transaction()
    from .services import operation_dispatch  # services sit beside this module

    return operation_dispatch(operation_id=operation_id)


def effect_status(
    operation_id: str | None, created: bool, operation: PaymentOperation | None = None
) -> int:
    """The status an effect means (stored on the key): 201 succeeded or created, 202 still
    unsettled, 402 a failed payment, 409 a failed follow-up, 200 nothing new. `operation`:
    the operation already read after its send (saves reading it again)."""
    if operation_id:
        op = operation
        if op is None or op.id != operation_id:
            op = PaymentOperation.objects.only("kind", "outcome").get(pk=operation_id)
        if op.outcome == Outcome.SUCCEEDED:
            return 201
        if op.outcome == Outcome.FAILED:
            return 402 if op.kind in PAYMENT_KINDS else 409
        return 202
    return 201 if created else 200


def keyed_effect(
    request: KeyedRequest,
    *,
    create: Callable[..., Created],
    verify: Callable[[], None] | None = None,
    in_transaction: bool = True,
    operation_for: Callable[[str, str], str | None] = operation_of,
    dispatch: bool = True,
    answer: Callable[[Keyed | Exception], Answer | None] | None = None,
) -> Keyed:
    """The ladder (module docstring). `create()` makes the effect and returns `Created`;
    with `in_transaction` (the default) it runs inside the transaction that binds the key.
    An effect whose core call must read the provider first (a manual resolution) runs with
    `in_transaction=False` and gets `bind(resource_type, resource_id)` to call inside its
    own transaction. `verify()` reads back a person's word first, outside any transaction.
    `operation_for(type, id)` names the operation to dispatch of a resumed resource.

    `answer` (a face whose protocol replays answers: ACP) renders the request's outcome —
    a `Keyed`, or the refusal raised — as the face's `Answer`, stored with the key, so a
    replay returns it unchanged (`Keyed.answer`); a 5xx answer is not stored (the key is
    forgotten and the same key processed afresh); None (a crash) keeps today's rule."""
    claim = key_claim(
        api_client=request.api_client,
        route=request.route,
        key=request.key,
        path=request.path,
        body=request.body,
    )
    if claim.replay:
        record = claim.record
        stored = record.response_body if answer is not None else None
        return Keyed(
            record.resource_type,
            record.resource_id,
            replayed=True,
            created=False,
            operation_id=operation_for(record.resource_type, record.resource_id),
            answer=Answer(**stored) if stored else None,
        )

    def finish(keyed: Keyed) -> Keyed:
        if answer is None:
            if not claim.completed:  # else: by the transaction that applied the answer
                key_complete(
                    claim,
                    status=effect_status(keyed.operation_id, keyed.created, keyed.operation),
                )
            return keyed
        keyed.answer = answer(keyed)
        assert keyed.answer is not None  # a face renders every Keyed (None answers a refusal)
        if keyed.answer.status >= 500:
            key_forget(claim)
        else:
            key_complete(claim, status=keyed.answer.status, answer=keyed.answer)
        return keyed

    try:
        if claim.taken_over and claim.resource_id:
            kind, ident = claim.record.resource_type, claim.resource_id
            op_id = operation_for(kind, ident)
            dispatched = dispatch_when_pending(op_id) if dispatch else None
            return finish(
                Keyed(
                    kind,
                    ident,
                    resumed=True,
                    operation_id=op_id,
                    operation=dispatched if answer is None else None,
                )
            )
        if verify is not None:
            assert_outside_transaction()
            verify()
        if in_transaction:
            with transaction.atomic():
                made = create()
                key_bind(claim, resource_type=made.resource_type, resource_id=made.resource_id)
        else:
            made = create(
                lambda kind, ident: key_bind(claim, resource_type=kind, resource_id=ident)
            )
            if not claim.resource_id:
                key_bind(claim, resource_type=made.resource_type, resource_id=made.resource_id)
        sent = None
        completes = made.operation_id if answer is None else None
        if made.send is not None:
            # Claimed in the transaction that created it (committed above): send it now.
            assert_outside_transaction()
            with _completed_by_apply(claim, completes):
                made.send()
            if answer is None and made.operation_id:
                # Read once as the send left it: the status stored on the key and the
                # face's operation view both come from this row.
                sent = operation_for_view(made.operation_id)
        elif dispatch:
            with _completed_by_apply(claim, completes):
                dispatched = dispatch_when_pending(made.operation_id)
            if answer is None:
                sent = dispatched
        return finish(
            Keyed(
                made.resource_type,
                made.resource_id,
                created=made.created,
                operation_id=made.operation_id,
                operation=sent,
            )
        )
    except Exception as exc:
        status = getattr(exc, "status", None)
        refused = answer(exc) if answer is not None else None
        if refused is not None:
            # The face's own refusal (ACP): stored with the key, as any answer — a
            # refusal before any effect too (the same key replays it) — except a 5xx.
            if refused.status >= 500:
                key_forget(claim)
            else:
                key_complete(claim, status=refused.status, answer=refused)
        elif not claim.resource_id:
            # Nothing was created (the effect's transaction rolled back with the binding):
            # the key must not be bound.
            key_release(claim)
        elif isinstance(status, int):
            # A refusal once the effect exists: the key stays bound to it; a replay shows
            # its state.
            key_complete(claim, status=status)
        # else: a crash after the effect: keep the lease; the same key resumes the bound
        # resource once it expires.
        raise


# -- replays answered before anything else (REST's fast answers) --------------------------


# Compiled once per process, a prepared statement on PostgreSQL (payments.view_queries).
_REPLAY_READ = CompiledRead(
    lambda client_id, route, key: IdempotencyRecord.objects.filter(
        api_client_id=client_id,
        route=route,
        key=key,
    ).values_list("state", "fingerprint", "resource_type", "resource_id")[:1],
    "\x01verity-client",
    "\x01verity-route",
    "\x01verity-key",
)


def key_replay_of(
    *, api_client: ApiClient, route: str, key: str, path: str, body
) -> IdempotencyRecord | None:
    """The record when this request is a replay (record `done`, same fingerprint), else
    None — then the caller goes through `keyed_effect`, which decides every other case
    (new, reused, in flight, take-over) exactly as before.

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
    return IdempotencyRecord(
        api_client_id=api_client.pk,
        route=route,
        key=key,
        state=row[0],
        fingerprint=row[1],
        resource_type=row[2],
        resource_id=row[3],
    )


def _replayed_operation_query(client_id, route, key):
    record = IdempotencyRecord.objects.filter(api_client_id=client_id, route=route, key=key)
    done = record.filter(state=IdempotencyRecord.State.DONE, resource_type="operation")
    # One unique-index lookup each; the fingerprint is compared here, in constant time.
    return (
        operations_for_view()
        .filter(pk=Subquery(done.values("resource_id")[:1]))
        .annotate(view_replay_fingerprint=Subquery(record.values("fingerprint")[:1]))[:1]
    )


# A replayed payment: the record and the operation view in ONE statement (prepared on
# PostgreSQL), so a replay costs one database round trip.
_REPLAYED_OPERATION = CompiledRead(
    _replayed_operation_query, "\x01verity-client", "\x01verity-route", "\x01verity-key"
)


def key_replayed_operation(
    *, api_client: ApiClient, route: str, key: str, path: str, body
) -> PaymentOperation | None:
    """The operation (loaded for the operation view) when this request replays a finished
    one that created it — record `done`, resource an operation, same fingerprint — else
    None, and the caller goes through `keyed_effect`, as `key_replay_of`."""
    found = _REPLAYED_OPERATION.instances(api_client.pk, route, key)
    if not found:
        return None
    op = found[0]
    if not hmac.compare_digest(
        op.__dict__.pop("view_replay_fingerprint") or "", request_fingerprint(path=path, body=body)
    ):
        return None
    return op


__all__ = [
    "HEADER",
    "MAX_KEY_LENGTH",
    "REPLAYED_HEADER",
    "Answer",
    "Claim",
    "Created",
    "Keyed",
    "KeyedRequest",
    "canonical_json",
    "dispatch_when_pending",
    "effect_status",
    "key_bind",
    "key_claim",
    "key_complete",
    "key_forget",
    "key_release",
    "key_replay_of",
    "key_replayed_operation",
    "keyed_effect",
    "operation_of",
    "request_fingerprint",
]
