"""Query sets that load an operation view in ONE statement.

`operation_view` needs the operation, its purchase (and quote, for a failed payment's
next action), its hold, the payment that retried it, and three counts: dispatch and
reconcile provider calls, and payment attempts on the purchase. Joined, and counted with
scalar subqueries on the foreign-key indexes, that is one round trip instead of five;
`payments.selectors` falls back to its own queries for an operation loaded without them.

The counts are `RawSQL` on purpose: the ORM's `Subquery(…annotate(Count))` costs more CPU
to compile on every request (~5 ms, expression hashing) than the whole query takes in
PostgreSQL. The SQL is plain and portable (PostgreSQL and SQLite).
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import IntegerField, OuterRef, QuerySet, Subquery, TextField
from django.db.models.expressions import RawSQL
from django.utils.dateparse import parse_datetime

from .enums import PAYMENT_KINDS, CallPurpose
from .models import Dispute, PaymentOperation, ProviderCall, Purchase

_OP = PaymentOperation._meta.db_table
_CALL = ProviderCall._meta.db_table
_PAYMENT_KIND_VALUES = [k.value for k in PAYMENT_KINDS]


def _calls(purpose: CallPurpose) -> RawSQL:
    return RawSQL(
        f'SELECT COUNT(*) FROM "{_CALL}" c WHERE c."operation_id" = "{_OP}"."id" '
        f'AND c."purpose" = %s',
        [purpose.value],
        output_field=IntegerField(),
    )


def _payment_attempts() -> RawSQL:
    marks = ", ".join(["%s"] * len(_PAYMENT_KIND_VALUES))
    return RawSQL(
        f'SELECT COUNT(*) FROM "{_OP}" p WHERE p."purchase_id" = '
        f'"{_OP}"."purchase_id" AND p."kind" IN ({marks})',
        _PAYMENT_KIND_VALUES,
        output_field=IntegerField(),
    )


def _retried_by_id() -> RawSQL:
    # Only the id of the retry is shown: one scalar, not a join of its ~40 columns.
    return RawSQL(f'SELECT r."id" FROM "{_OP}" r WHERE r."retry_of_id" = "{_OP}"."id"', [])


def operations_for_view(qs: QuerySet | None = None) -> QuerySet:
    """`qs` (default: every operation) joined and annotated for `operation_view`."""
    qs = PaymentOperation.objects.all() if qs is None else qs
    return qs.select_related("purchase", "purchase__quote", "hold").annotate(
        view_dispatch_attempts=_calls(CallPurpose.DISPATCH),
        view_reconcile_attempts=_calls(CallPurpose.RECONCILE),
        view_payment_attempts=_payment_attempts(),
        view_retried_by_id=_retried_by_id(),
    )


def retried_by_id(op: PaymentOperation) -> str | None:
    """The id of the operation that retried `op`, from the annotation if loaded."""
    if "view_retried_by_id" in op.__dict__:
        return op.__dict__["view_retried_by_id"]
    retry = getattr(op, "retried_by", None)
    return retry.id if retry is not None else None


__all__ = ["operations_for_view", "retried_by_id"]


# -- the purchase view: its reads in one round trip ---------------------------------------
#
# `purchase_view` shows the purchase's operations (the latest payment, the refund summary,
# the customer copy), its order reference, its disputes and its fulfilment steps. Each is a
# `CompiledRead` below (the steps' is recovery.reads.STEP_STATES); the presenter runs them
# with `read_together` — one round trip on PostgreSQL — and keeps the results on the
# purchase instance for the rest of that one view (which drops them at its end).

_OPS_ATTR = "_view_operations"
_ORDER_ATTR = "_view_order_reference"
_DISPUTES_ATTR = "_view_disputes"


def purchase_view_calls(
    purchase_id: str, *, order_reference: bool = True, disputes: bool = True
) -> list[tuple]:
    """The (read, values) of the purchase view's own reads, for `read_together`: its
    operations, its order reference, its disputes — `purchase_view_keep` takes their rows
    in this order. `order_reference=False`: the purchase was read with it
    (`PURCHASE_BY_ID`, `PURCHASE_OF_CLIENT`; `purchase_order_rows` gives its rows);
    `disputes=False`: so were its disputes (`PURCHASE_WITH_LISTS_BY_ID`)."""
    values = (purchase_id,)
    calls: list[tuple] = [(_PURCHASE_OPERATIONS, values)]
    if order_reference:
        calls.append((_ORDER_REFERENCE, values))
    if disputes:
        calls.append((_PURCHASE_DISPUTES, values))
    return calls


def purchase_order_rows(purchase) -> list[tuple]:
    """The order-reference rows of a purchase read with its order reference (as
    `_ORDER_REFERENCE` returns them)."""
    reference = purchase.view_order_reference
    return [(reference,)] if reference is not None else []


def purchase_view_keep(purchase, ops_rows: list, order_rows: list, dispute_rows: list) -> list:
    """Keep the rows of `purchase_view_calls` on the instance; the operations as model
    instances (with their parents), ordered by creation."""
    ops = _PURCHASE_OPERATIONS.instances_of(ops_rows)
    for op in ops:  # as the related manager does: each operation knows this purchase
        op.purchase = purchase
    setattr(purchase, _OPS_ATTR, ops)
    purchase.__dict__[_ORDER_ATTR] = order_rows[0][0] if order_rows else None
    purchase.__dict__[_DISPUTES_ATTR] = dispute_rows
    return ops


def purchase_operations_load(purchase) -> list:
    """Read the purchase's operations, order reference and disputes (one round trip) and
    keep them on the instance (`purchase_view_keep`)."""
    return purchase_view_keep(purchase, *read_together(*purchase_view_calls(purchase.pk)))


def purchase_order_reference(purchase, read) -> str | None:
    """`read(purchase.id)` once per `purchase_view` (the view and the customer copy both
    show it)."""
    if _ORDER_ATTR not in purchase.__dict__:
        if purchase_operations_loaded(purchase) is None:
            return read(purchase.id)  # not inside a purchase_view: read as before
        purchase.__dict__[_ORDER_ATTR] = read(purchase.id)
    return purchase.__dict__[_ORDER_ATTR]


def purchase_operations_loaded(purchase) -> list | None:
    """The list `purchase_operations_load` kept on this instance, or None."""
    return getattr(purchase, _OPS_ATTR, None)


def purchase_disputes(purchase) -> list[tuple]:
    """(id, status, amount, currency, reason, evidence_due_by) of the purchase's
    disputes, by opening time: the rows kept by `purchase_view_keep`, else read."""
    kept = purchase.__dict__.get(_DISPUTES_ATTR)
    return kept if kept is not None else _PURCHASE_DISPUTES.rows(purchase.pk)


def purchase_operations_forget(purchase) -> None:
    purchase.__dict__.pop(_OPS_ATTR, None)
    purchase.__dict__.pop(_ORDER_ATTR, None)
    purchase.__dict__.pop(_DISPUTES_ATTR, None)


__all__ += [
    "purchase_disputes",
    "purchase_operations_forget",
    "purchase_operations_load",
    "purchase_operations_loaded",
    "purchase_order_reference",
    "purchase_order_rows",
    "purchase_view_calls",
    "purchase_view_keep",
]


# -- hot reads compiled once per process, run as prepared statements ----------
#
# Building a queryset and compiling it to SQL costs more CPU than PostgreSQL spends on the
# statement (select_related joins, annotations, ORDER BY expressions hashed over and over),
# and PostgreSQL plans the same statement again on every request. A `CompiledRead` builds
# its queryset ONCE per process with marker values, keeps the SQL and the compiler (which
# knows how to turn rows into model instances, related objects and annotations included),
# and on each call only swaps the markers for the values. On PostgreSQL the statement runs
# on a server-side-binding cursor with `prepare=True` (a named prepared statement on this
# connection: planned once per connection); Django's own cursors are left as they are
# (client-side binding, never prepared). Named prepared statements need a direct
# connection or PgBouncer >= 1.21 (max_prepared_statements); `DATABASE_PREPARED_STATEMENTS`
# off (settings) runs the same compiled SQL on Django's cursor instead: no prepared
# statements, still no compilation per request.

import contextlib  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from django.conf import settings as _settings  # noqa: E402
from django.db import connections as _connections  # noqa: E402

# Django opens its psycopg connections with `prepare_threshold=None` (to keep PgBouncer
# < 1.21 working), and with the threshold None psycopg ignores `execute(prepare=True)`:
# the statement is sent unnamed, parsed and planned again on every call. So the threshold
# is set for the length of our own execute only: a number no statement reaches, so only an
# explicit `prepare=True` prepares; Django's cursors (ClientCursor: never prepared) run
# with the threshold as Django left it, and their statements are not counted.
_ONLY_WHEN_ASKED = 2**62


@contextlib.contextmanager
def preparing(pg):
    """Inside: `execute(..., prepare=True)` on `pg` (Django's psycopg connection) really
    prepares; outside, the connection's threshold is as Django set it."""
    threshold = pg.prepare_threshold
    if threshold is not None:
        yield
        return
    pg.prepare_threshold = _ONLY_WHEN_ASKED
    try:
        yield
    finally:
        pg.prepare_threshold = threshold


_PLACEHOLDER = re.compile(r"%%|%s")


def _numbered(sql: str) -> bytes:
    """Django's SQL with PostgreSQL's own `$1, $2 …` placeholders (and `%%` as `%`), for a
    psycopg RawCursor: psycopg converts `%s` queries on every execute and caches the
    conversion only for statements under 4 KB, which the operation view's is not."""
    count = 0

    def number(match) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(number, sql).encode()


_CURSORS_ATTR = "_verity_raw_cursors"


def _raw_cursors(connection, pg, count: int) -> list:
    """`count` RawCursors on this psycopg connection, kept on Django's connection wrapper and
    reused (a cursor costs an adapters map to build); new ones after a reconnection."""
    import psycopg

    held = connection.__dict__.get(_CURSORS_ATTR)
    if held is None or held[0] is not pg:
        held = (pg, [])
        connection.__dict__[_CURSORS_ATTR] = held
    cursors = held[1]
    while len(cursors) < count:
        cursor = psycopg.RawCursor(pg)
        _fast_timestamps(connection, cursor)
        cursors.append(cursor)
    return cursors[:count]


def _fast_timestamps(connection, cursor) -> None:
    """Django loads every timestamptz with its own loader, a Python subclass of psycopg's
    (a regular expression per value, then `replace(tzinfo=…)`); an operation row has
    twelve. When the session's time zone is Django's very tzinfo (TIME_ZONE = "UTC" both
    ways), psycopg's C loader gives the same datetime, tzinfo object included: this cursor
    uses it. Otherwise Django's loader stays."""
    from psycopg import adapters, pq

    try:
        from psycopg._tz import get_tzinfo

        same = get_tzinfo(cursor.connection.pgconn) is connection.timezone
    except Exception:  # noqa: BLE001 - psycopg's internals moved: keep Django's loader
        same = False
    if same:
        cursor.adapters.register_loader(
            "timestamptz", adapters.get_loader(adapters.types["timestamptz"].oid, pq.Format.TEXT)
        )


def prepared_statements_on(connection) -> bool:
    return connection.vendor == "postgresql" and getattr(
        _settings, "DATABASE_PREPARED_STATEMENTS", True
    )


class CompiledRead:
    """`build(*markers)` -> a QuerySet; `markers` are values no real call passes (of each
    parameter's type: a string for a text column, an int for an integer one)."""

    def __init__(self, build, *markers) -> None:
        self._build = build
        self._markers = markers
        # Per thread (a compiler holds its thread's connection) and database alias.
        self._local = threading.local()

    @property
    def _compiled(self) -> dict[str, tuple]:
        compiled = getattr(self._local, "compiled", None)
        if compiled is None:
            compiled = self._local.compiled = {}
        return compiled

    def _compile(self, using: str) -> tuple:
        qs = self._build(*self._markers).using(using)
        compiler = qs.query.get_compiler(using=using)
        sql, params = compiler.as_sql()  # also sets compiler.select / klass_info
        slots = []
        for p in params:
            hits = [i for i, m in enumerate(self._markers) if type(m) is type(p) and m == p]
            slots.append(hits[0] if hits else None)
        missing = set(range(len(self._markers))) - {s for s in slots if s is not None}
        if missing:
            raise ValueError(f"marker(s) {sorted(missing)} not found in the compiled SQL")
        # The columns' converters (from_db_value & co.), found once: results_iter would
        # look them up again on every call (a field comparison per column).
        fields = [col[0] for col in compiler.select[: compiler.col_count]]
        converters = compiler.get_converters(fields)
        compiled = self._compiled[using] = (
            sql,
            tuple(params),
            tuple(slots),
            compiler,
            converters,
            _numbered(sql),
        )
        return compiled

    def _statement(self, values, using: str) -> tuple[str, bytes, list]:
        """(the SQL with `%s` placeholders, the same with `$n` ones, the arguments)."""
        sql, params, slots, _compiler, _converters, numbered = self._compiled.get(
            using
        ) or self._compile(using)
        return (
            sql,
            numbered,
            [p if s is None else values[s] for p, s in zip(params, slots, strict=False)],
        )

    def _convert(self, raw: list, using: str) -> list:
        _sql, _params, _slots, compiler, converters, _numbered_sql = self._compiled[using]
        count = compiler.col_count
        rows = [r[:count] for r in raw]
        if converters:
            return [tuple(r) for r in compiler.apply_converters(rows, converters)]
        return rows

    def rows(self, *values, using: str = "default") -> list:
        return read_together((self, values), using=using)[0]

    def instances(self, *values, using: str = "default") -> list:
        """Model instances as the queryset would yield them (related objects and
        annotations set), from `rows`."""
        return self.instances_of(self.rows(*values, using=using), using=using)

    def instances_of(self, rows: list, *, using: str = "default") -> list:
        """`instances` of rows this read returned (from `rows` or `read_together`)."""
        model_cls, init_list, start, end, populators, annotations = self._populating(using)
        out = []
        for row in rows:
            obj = _instance(model_cls, using, init_list, row[start:end])
            for populator in populators:
                _populate(populator, row, obj, using)
            for attr_name, col_pos in annotations:
                setattr(obj, attr_name, row[col_pos])
            out.append(obj)
        return out

    def _populating(self, using: str) -> tuple:
        # What turns a row into instances, found once per compilation (as the queryset's
        # ModelIterable finds it on every evaluation).
        from django.db.models.query import get_related_populators

        compiled = self._compiled.get(using) or self._compile(using)
        found = getattr(self._local, "populating", None)
        if found is not None and found[0] is compiled:
            return found[1]
        compiler = compiled[3]
        select, klass_info = compiler.select, compiler.klass_info
        fields = klass_info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        populating = (
            klass_info["model"],
            [f[0].target.attname for f in select[start:end]],
            start,
            end,
            # django-stubs 6 describes Django 6 (fetch_mode); Django 5.2 runs here.
            get_related_populators(klass_info, select, using),  # type: ignore[call-arg]
            tuple((compiler.annotation_col_map or {}).items()),
        )
        self._local.populating = (compiled, populating)
        return populating


# -- model instances from rows, without Model.__init__
#
# `Model.from_db` builds an instance through `Model.__init__`: the pre_init and post_init
# signals, a descriptor `__set__` per field, and (ConcurrentTransitionMixin) the FSM's
# initial states: ~40 % of a replayed payment's ORM time for its four instances. For a
# model whose construction is only that (no __init__ or from_db of its own, no pre_init /
# post_init receiver, every concrete column selected) the same instance is built by
# filling its __dict__ in `from_db`'s positional order; any other model goes through
# `from_db` itself. tests/payments/test_view_queries.py compares both field by field.

_PLAIN_INITS: tuple = ()
_plans: dict = {}


def _plain_setter(model_cls, field) -> bool:
    """Setting this field in __init__ only stores the value in the instance's __dict__."""
    import inspect

    from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
    from django_fsm import FSMFieldDescriptor, FSMKeyField

    descriptor = inspect.getattr_static(model_cls, field.attname, None)
    if not hasattr(type(descriptor), "__set__"):
        return True
    if isinstance(descriptor, ForeignKeyDeferredAttribute):
        return True  # on a new instance: no cached related object to drop
    # An FSM state: stored as is, unless it switches the class (state proxies) or converts.
    return (
        isinstance(descriptor, FSMFieldDescriptor)
        and not descriptor.field.state_proxy
        and not isinstance(descriptor.field, FSMKeyField)
    )


def _build_plan(model_cls) -> tuple | None:
    from django.db.models import Model, signals
    from django_fsm import ConcurrentTransitionMixin

    global _PLAIN_INITS
    if not _PLAIN_INITS:
        _PLAIN_INITS = (Model.__init__, ConcurrentTransitionMixin.__init__)
    if (
        model_cls.__init__ not in _PLAIN_INITS
        # A bound classmethod has __func__; the stub types from_db as a plain callable.
        or model_cls.from_db.__func__ is not Model.from_db.__func__  # type: ignore[attr-defined]
        or signals.pre_init.has_listeners(model_cls)
        or signals.post_init.has_listeners(model_cls)
        or not all(_plain_setter(model_cls, f) for f in model_cls._meta.concrete_fields)
    ):
        return None
    attnames = tuple(f.attname for f in model_cls._meta.concrete_fields)
    initial = None
    if model_cls.__init__ is ConcurrentTransitionMixin.__init__:
        initial = _initial_states_plan(model_cls, attnames)
    return attnames, initial


def _initial_states_plan(model_cls, attnames: tuple):
    """How ConcurrentTransitionMixin.__init__ records the state fields' initial values:
    (the attribute it writes, the state fields' attnames) — checked on a probe instance,
    so the dict is built directly (`_update_initial_state` walks every field through
    filter/lambda on each instance). True: call `_update_initial_state` as it is."""
    from django_fsm import FSMFieldMixin

    states = tuple(f.attname for f in model_cls._meta.fields if isinstance(f, FSMFieldMixin))
    probe = model_cls.__new__(model_cls)
    probe.__dict__.update((a, f"\x01probe-{i}") for i, a in enumerate(attnames))
    before = set(probe.__dict__)
    probe._update_initial_state()
    added = set(probe.__dict__) - before
    if len(added) != 1:
        return True
    (name,) = added
    if probe.__dict__[name] != {a: probe.__dict__[a] for a in states}:
        return True
    return name, states


def _instance(model_cls, using: str, init_list, values):
    """`model_cls.from_db(using, init_list, values)`, without Model.__init__ when that
    builds the same instance (see above)."""
    plan = _plans.get(model_cls, False)
    if plan is False:
        plan = _plans[model_cls] = _build_plan(model_cls)
    if plan is None or len(values) != len(plan[0]):
        return model_cls.from_db(using, init_list, values)  # deferred fields, or special
    from django.db.models.base import ModelState

    obj = model_cls.__new__(model_cls)
    state = ModelState()
    state.adding, state.db = False, using
    obj.__dict__["_state"] = state
    values_of = obj.__dict__
    values_of.update(zip(plan[0], values, strict=False))
    initial = plan[1]
    if initial is True:
        obj._update_initial_state()  # ConcurrentTransitionMixin.__init__'s own step
    elif initial is not None:  # the same step, its dict built directly
        name, states = initial
        values_of[name] = {a: values_of[a] for a in states}
    return obj


def _populate(populator, row, from_obj, using: str) -> None:
    """Django's RelatedPopulator.populate (select_related), building with `_instance`."""
    if populator.reorder_for_init:
        obj_data = populator.reorder_for_init(row)
    else:
        obj_data = row[populator.cols_start : populator.cols_end]
    if obj_data[populator.pk_idx] is None:
        obj = None
    else:
        obj = _instance(populator.model_cls, using, populator.init_list, obj_data)
        for related in populator.related_populators:
            _populate(related, row, obj, using)
    populator.local_setter(from_obj, obj)
    if obj is not None:
        populator.remote_setter(obj, from_obj)


def execute_prepared(
    sql: str, params: list[Any], *, fetch: str | None = "all", using: str = "default"
) -> Any:
    """One raw statement (Django's `%s` placeholders) as a named prepared statement on the
    connection: parsed and planned once per connection, not on every call. With prepared
    statements off (SQLite, or PgBouncer < 1.21 in transaction mode) the same SQL runs on
    Django's own cursor. `fetch`: "all" (the rows), "one" (a row or None) or None.

    As on Django's cursors: the CONN_HEALTH_CHECKS probe of a reused connection runs first,
    errors come out as Django's (an unreachable database is OperationalError: the 503 of
    config.db_unavailable, not a 500) and mark the connection, and the statement is logged
    when queries are (DEBUG, or a test counting statements)."""
    connection = _connections[using]
    if not prepared_statements_on(connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return _fetched(cursor, fetch)
    import psycopg

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    pg = connection.connection
    started = time.monotonic()
    # A plain psycopg Cursor binds server-side (Django's are ClientCursors).
    with connection.wrap_database_errors, preparing(pg), psycopg.Cursor(pg) as cursor:
        cursor.execute(sql, params, prepare=True)
        out = _fetched(cursor, fetch)
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return out


def _fetched(cursor, fetch: str | None):
    if fetch == "all":
        return cursor.fetchall()
    return cursor.fetchone() if fetch == "one" else None


def read_together(*calls: tuple[CompiledRead, tuple], using: str = "default") -> list[list]:
    """Run each (read, values) of `calls`; their rows, in order. On PostgreSQL with
    prepared statements the statements go in ONE round trip (a psycopg pipeline: each is
    sent, then one Sync, then every result is read), each a named prepared statement;
    otherwise one after the other on Django's cursor (unprepared, as before)."""
    statements = [read._statement(values, using) for read, values in calls]
    connection = _connections[using]
    if prepared_statements_on(connection):
        # As Django's own cursors: the CONN_HEALTH_CHECKS probe of a connection reused from
        # an earlier request first (one the database dropped while idle is replaced).
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        # Server-side-binding psycopg cursors (Django's are ClientCursors). Errors come out
        # as Django's (an unreachable database is OperationalError: the 503 of
        # config.db_unavailable / payments.api.problems, not a 500) and mark the
        # connection for CONN_HEALTH_CHECKS, as on Django's own cursors.
        pg = connection.connection
        started = time.monotonic()
        with connection.wrap_database_errors, preparing(pg):
            cursors = _raw_cursors(connection, pg, len(statements))
            if len(statements) == 1:
                cursors[0].execute(statements[0][1], statements[0][2], prepare=True)
            else:
                with pg.pipeline():
                    for cursor, (_sql, numbered, args) in zip(cursors, statements, strict=False):
                        cursor.execute(numbered, args, prepare=True)
            raws = [cursor.fetchall() for cursor in cursors]
        if connection.queries_logged:  # as execute_prepared: counted like Django's own
            took = f"{time.monotonic() - started:.3f}"
            connection.queries_log.extend(
                {"sql": sql, "time": took} for sql, _numbered, _args in statements
            )
    else:
        raws = []
        with connection.cursor() as cursor:
            for sql, _numbered_sql, args in statements:
                cursor.execute(sql, args)
                raws.append(cursor.fetchall())
    return [read._convert(raw, using) for (read, _), raw in zip(calls, raws, strict=False)]


_OPERATION_VIEW = CompiledRead(
    lambda pk: operations_for_view().filter(pk=pk)[:1], "\x01verity-operation-id"
)


def operation_for_view(operation_id: str) -> PaymentOperation | None:
    """`operations_for_view().filter(pk=…).first()` without its per-request compilation."""
    found = _OPERATION_VIEW.instances(operation_id)
    return found[0] if found else None


_PURCHASE_OPERATIONS = CompiledRead(
    lambda purchase_id: (
        PaymentOperation.objects.filter(purchase_id=purchase_id)
        .select_related("parent")
        .order_by("created_at", "id")
    ),
    "\x01verity-purchase",
)


def _order_reference_query(purchase_id):
    from recovery.models import Order

    # As presenters._order_reference: `.first()` of the purchase's orders, by primary key.
    return Order.objects.filter(purchase_id=purchase_id).values_list("reference").order_by("pk")[:1]


_ORDER_REFERENCE = CompiledRead(_order_reference_query, "\x01verity-purchase")

# As presenters.disputes_view read them: `purchase.disputes.order_by("opened_at", "id")`,
# the six columns the view shows.
_PURCHASE_DISPUTES = CompiledRead(
    lambda purchase_id: (
        Dispute.objects.filter(purchase_id=purchase_id)
        .order_by("opened_at", "id")
        .values_list("id", "status", "amount", "currency", "reason", "evidence_due_by")
    ),
    "\x01verity-purchase",
)


def _purchases_for_view() -> QuerySet:
    """Purchases with their quote and their order reference (`view_order_reference`, as
    `_ORDER_REFERENCE` reads it), for a purchase view: one statement fewer."""
    reference = Subquery(_order_reference_query(OuterRef("pk")))
    return Purchase.objects.select_related("quote").annotate(view_order_reference=reference)


# The client's purchase (as payments.selectors.purchase_get_for_client), for a purchase view
# read in the same round trip as its other reads.
PURCHASE_OF_CLIENT = CompiledRead(
    lambda pk, client_id: _purchases_for_view().filter(pk=pk, api_client_id=client_id)[:1],
    "\x01verity-purchase",
    "\x01verity-client",
)

# A purchase by id alone (the view a storefront event carries).
PURCHASE_BY_ID = CompiledRead(
    lambda pk: _purchases_for_view().filter(pk=pk)[:1], "\x01verity-purchase"
)


def _json_rows(table: str, columns: tuple[str, ...], order: tuple[str, ...] = ()) -> RawSQL:
    """A purchase's rows of `table` as one JSON array of arrays (`columns`, in `order`), as
    text, read with the purchase (PostgreSQL)."""
    values = ", ".join(f'x."{c}"' for c in columns)
    by = f" ORDER BY {', '.join(f'x.{c}' for c in order)}" if order else ""
    return RawSQL(
        f"SELECT COALESCE(json_agg(json_build_array({values}){by}), '[]')::text "
        f'FROM "{table}" x WHERE x."purchase_id" = "{Purchase._meta.db_table}"."id"',
        [],
        output_field=TextField(),
    )


_DISPUTE_COLUMNS = ("id", "status", "amount", "currency", "reason", "evidence_due_by")


def _purchases_with_lists() -> QuerySet:
    """`_purchases_for_view`, with the disputes (`_PURCHASE_DISPUTES`' columns and order)
    and the step states (recovery.reads.STEP_STATES') as JSON in the same row."""
    from recovery.models import StepRun

    return _purchases_for_view().annotate(
        view_disputes=_json_rows(Dispute._meta.db_table, _DISPUTE_COLUMNS, ("opened_at", "id")),
        view_steps=_json_rows(StepRun._meta.db_table, ("step", "state")),
    )


# A purchase by id with its disputes and steps: the view an event carries in two
# statements (this and its operations) instead of four, on PostgreSQL.
PURCHASE_WITH_LISTS_BY_ID = CompiledRead(
    lambda pk: _purchases_with_lists().filter(pk=pk)[:1], "\x01verity-purchase"
)


def purchase_lists_rows(purchase) -> tuple[list[tuple], list[tuple]]:
    """The (dispute rows, step rows) of a purchase read by `PURCHASE_WITH_LISTS_BY_ID`, as
    `_PURCHASE_DISPUTES` and STEP_STATES return them."""
    disputes = [
        (d_id, status, amount, currency, reason, parse_datetime(due) if due else None)
        for d_id, status, amount, currency, reason, due in json.loads(purchase.view_disputes)
    ]
    steps = [(step, state) for step, state in json.loads(purchase.view_steps)]
    return disputes, steps


__all__ += [
    "CompiledRead",
    "PURCHASE_BY_ID",
    "PURCHASE_WITH_LISTS_BY_ID",
    "purchase_lists_rows",
    "PURCHASE_OF_CLIENT",
    "execute_prepared",
    "operation_for_view",
    "preparing",
    "prepared_statements_on",
    "read_together",
]
