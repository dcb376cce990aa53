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

from django.db.models import IntegerField, QuerySet
from django.db.models.expressions import RawSQL

from .enums import PAYMENT_KINDS, CallPurpose
from .models import PaymentOperation, ProviderCall

_OP = PaymentOperation._meta.db_table
_CALL = ProviderCall._meta.db_table
_PAYMENT_KIND_VALUES = [k.value for k in PAYMENT_KINDS]


def _calls(purpose: CallPurpose) -> RawSQL:
    return RawSQL(f'SELECT COUNT(*) FROM "{_CALL}" c WHERE c."operation_id" = "{_OP}"."id" '
                  f'AND c."purpose" = %s', [purpose.value], output_field=IntegerField())


def _payment_attempts() -> RawSQL:
    marks = ", ".join(["%s"] * len(_PAYMENT_KIND_VALUES))
    return RawSQL(f'SELECT COUNT(*) FROM "{_OP}" p WHERE p."purchase_id" = '
                  f'"{_OP}"."purchase_id" AND p."kind" IN ({marks})', _PAYMENT_KIND_VALUES,
                  output_field=IntegerField())


def _retried_by_id() -> RawSQL:
    # Only the id of the retry is shown: one scalar, not a join of its ~40 columns.
    return RawSQL(f'SELECT r."id" FROM "{_OP}" r WHERE r."retry_of_id" = "{_OP}"."id"', [])


def operations_for_view(qs: QuerySet | None = None) -> QuerySet:
    """`qs` (default: every operation) joined and annotated for `operation_view`."""
    qs = PaymentOperation.objects.all() if qs is None else qs
    return (qs.select_related("purchase", "purchase__quote", "hold")
            .annotate(view_dispatch_attempts=_calls(CallPurpose.DISPATCH),
                      view_reconcile_attempts=_calls(CallPurpose.RECONCILE),
                      view_payment_attempts=_payment_attempts(),
                      view_retried_by_id=_retried_by_id()))


def retried_by_id(op: PaymentOperation) -> str | None:
    """The id of the operation that retried `op`, from the annotation if loaded."""
    if "view_retried_by_id" in op.__dict__:
        return op.view_retried_by_id
    retry = getattr(op, "retried_by", None)
    return retry.id if retry is not None else None


__all__ = ["operations_for_view", "retried_by_id"]


# -- the purchase view: its operations read once ----------------------------------------

_OPS_ATTR = "_view_operations"


def purchase_operations_load(purchase) -> list:
    """Read the purchase's operations once (with their parents), ordered by creation, and
    keep them on the instance for the rest of one `purchase_view` (which drops them at its
    end): the latest payment, the refund summary and the customer copy all read this list
    instead of one query each."""
    ops = _PURCHASE_OPERATIONS.instances(purchase.pk)
    for op in ops:  # as the related manager does: each operation knows this purchase
        op.purchase = purchase
    setattr(purchase, _OPS_ATTR, ops)
    # The order reference the view shows (payments.api.presenters._order_reference's read,
    # compiled once: `.first()` compiles an ORDER BY on every call).
    found = _ORDER_REFERENCE.rows(purchase.pk)
    purchase.__dict__[_ORDER_ATTR] = found[0][0] if found else None
    return ops


_ORDER_ATTR = "_view_order_reference"


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


def purchase_operations_forget(purchase) -> None:
    purchase.__dict__.pop(_OPS_ATTR, None)
    purchase.__dict__.pop(_ORDER_ATTR, None)


__all__ += ["purchase_operations_forget", "purchase_order_reference", "purchase_operations_load",
            "purchase_operations_loaded"]


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

import threading  # noqa: E402

from django.conf import settings as _settings  # noqa: E402
from django.db import connections as _connections  # noqa: E402


def prepared_statements_on(connection) -> bool:
    return (connection.vendor == "postgresql"
            and getattr(_settings, "DATABASE_PREPARED_STATEMENTS", True))


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
        fields = [col[0] for col in compiler.select[:compiler.col_count]]
        converters = compiler.get_converters(fields)
        compiled = self._compiled[using] = (sql, tuple(params), tuple(slots), compiler,
                                            converters)
        return compiled

    def rows(self, *values, using: str = "default") -> list:
        sql, params, slots, compiler, converters = (self._compiled.get(using)
                                                    or self._compile(using))
        args = [p if s is None else values[s] for p, s in zip(params, slots)]
        connection = _connections[using]
        if prepared_statements_on(connection):
            import psycopg

            connection.ensure_connection()
            # A plain psycopg Cursor binds server-side; Django's are ClientCursors. Errors
            # come out as Django's (an unreachable database is OperationalError: the 503
            # of config.db_unavailable / payments.api.problems, not a 500) and mark the
            # connection for CONN_HEALTH_CHECKS, as on Django's own cursors.
            with connection.wrap_database_errors, \
                    psycopg.Cursor(connection.connection) as cursor:
                cursor.execute(sql, args, prepare=True)
                raw = cursor.fetchall()
        else:
            with connection.cursor() as cursor:
                cursor.execute(sql, args)
                raw = cursor.fetchall()
        count = compiler.col_count
        rows = [r[:count] for r in raw]
        if converters:
            return [tuple(r) for r in compiler.apply_converters(rows, converters)]
        return rows

    def instances(self, *values, using: str = "default") -> list:
        """Model instances as the queryset would yield them (related objects and
        annotations set), from `rows`."""
        from django.db.models.query import get_related_populators

        rows = self.rows(*values, using=using)
        compiler = self._compiled[using][3]
        select, klass_info = compiler.select, compiler.klass_info
        annotation_col_map = compiler.annotation_col_map
        model_cls = klass_info["model"]
        fields = klass_info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        init_list = [f[0].target.attname for f in select[start:end]]
        populators = get_related_populators(klass_info, select, using)
        out = []
        for row in rows:
            obj = model_cls.from_db(using, init_list, row[start:end])
            for populator in populators:
                populator.populate(row, obj)
            for attr_name, col_pos in (annotation_col_map or {}).items():
                setattr(obj, attr_name, row[col_pos])
            out.append(obj)
        return out


_OPERATION_VIEW = CompiledRead(
    lambda pk: operations_for_view().filter(pk=pk)[:1], "\x01verity-operation-id")


def operation_for_view(operation_id: str) -> PaymentOperation | None:
    """`operations_for_view().filter(pk=…).first()` without its per-request compilation."""
    found = _OPERATION_VIEW.instances(operation_id)
    return found[0] if found else None


_PURCHASE_OPERATIONS = CompiledRead(
    lambda purchase_id: PaymentOperation.objects.filter(purchase_id=purchase_id)
    .select_related("parent").order_by("created_at", "id"), "\x01verity-purchase")



def _order_reference_query(purchase_id):
    from recovery.models import Order

    # As presenters._order_reference: `.first()` of the purchase's orders, by primary key.
    return Order.objects.filter(purchase_id=purchase_id).values_list(
        "reference").order_by("pk")[:1]


_ORDER_REFERENCE = CompiledRead(_order_reference_query, "\x01verity-purchase")

__all__ += ["CompiledRead", "operation_for_view", "prepared_statements_on"]
