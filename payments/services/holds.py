"""Spending limits: per API client holds (reserved, consumed, released) and the
limit and currency checks a new money movement passes first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from ..enums import HoldState, LimitPeriod, OperationKind, Outcome, Owner, RetryAdvice
from ..errors import DomainError, ErrorCode
from ..locks import lock_client
from ..models import ApiClient, Hold, PaymentOperation


def _period_start(client: ApiClient, now: datetime | None = None) -> datetime | None:
    now = now or timezone.now()
    if client.limit_period == LimitPeriod.DAY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if client.limit_period == LimitPeriod.MONTH:
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


def _counted_holds(client: ApiClient) -> tuple[QuerySet[Hold], Q, Q]:
    """The client's holds and what of them counts against its limit: consumed in the
    current period, and reserved (a hold counts in the period it was reserved in until it
    settles). One limit, one currency: only holds in the client's currency count."""
    start = _period_start(client)
    holds = Hold.objects.filter(api_client=client, currency__iexact=client.currency)
    consumed = Q(state=HoldState.CONSUMED)
    if start is not None:
        consumed &= Q(period_start=start)
    return holds, consumed, Q(state=HoldState.RESERVED)


def _limit_used(client: ApiClient) -> int:
    """consumed + reserved, as `client_limits` counts them, in one statement."""
    holds, consumed, reserved = _counted_holds(client)
    used: int = holds.filter(consumed | reserved).aggregate(s=Sum("amount"))["s"] or 0
    return used


def client_limits(client: ApiClient) -> dict[str, Any]:
    """limit, consumed, reserved, unknown_exposure (current period; a hold counts in the
    period it was reserved in until it settles)."""
    holds, counted_consumed, counted_reserved = _counted_holds(client)
    consumed_q = holds.filter(counted_consumed)
    reserved_q = holds.filter(counted_reserved)
    consumed = consumed_q.aggregate(s=Sum("amount"))["s"] or 0
    reserved = reserved_q.aggregate(s=Sum("amount"))["s"] or 0
    unknown = (
        reserved_q.filter(operation__outcome=Outcome.UNKNOWN).aggregate(s=Sum("amount"))["s"] or 0
    )
    return {
        "limit": client.spending_limit,
        "currency": client.currency,
        "consumed": consumed,
        "reserved": reserved,
        "unknown_exposure": unknown,
        "available": (
            max(client.spending_limit - consumed - reserved, 0) if client.spending_limit else None
        ),
        "period": client.limit_period,
    }


def _check_currency_allowed(client: ApiClient | None, currency: str) -> None:
    """A client's spending limit is kept in one currency, its own: holds are never summed
    across currencies as raw minor units, and a purchase in a currency the client has no
    limit for is refused (docs/walkthrough.md#api-rules-the-code-relies-on)."""
    if client is not None and currency.lower() != (client.currency or "").lower():
        raise DomainError(
            ErrorCode.CURRENCY_NOT_ALLOWED,
            f"This API client's spending limit is in {client.currency}; a "
            f"purchase in {currency.lower()} is not allowed.",
            status=422,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.SUPPORT,
            extra={"allowed_currencies": [client.currency]},
        )


def _check_limit(client: ApiClient | None, amount: int) -> None:
    if client is None or not client.spending_limit:
        return
    if _limit_used(client) + amount > client.spending_limit:
        figures = client_limits(client)  # the refusal shows them
        raise DomainError(
            ErrorCode.SPENDING_LIMIT_EXCEEDED,
            "This API client's spending limit does not cover this amount.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.SUPPORT,
            extra={"limits": figures},
        )


def _hold_client_id(op: PaymentOperation) -> str | None:
    """The client whose allowance the operation spends (its id: the row is read once, when
    it is locked)."""
    if op.requested_by_client_id:
        return op.requested_by_client_id
    if op.kind != OperationKind.REFUND:
        return op.purchase.api_client_id
    return None


def _hold_reserve(op: PaymentOperation) -> bool:
    """Reserve at the claim, under the client's row lock. False = limit exceeded."""
    client_id = _hold_client_id(op)
    if client_id is None:
        return True
    client = lock_client(client_id)
    hold = Hold(
        api_client=client,
        operation=op,
        amount=op.amount,
        currency=op.currency,
        period_start=_period_start(client),
    )
    if not client.spending_limit:
        Hold.objects.bulk_create([hold], ignore_conflicts=True)
        return True
    if _hold_insert_within_limit(client, hold):
        return True
    # Nothing inserted: the limit refused it, or this operation's hold exists already (a
    # claim made again: it stands, as the insert that ignored it left it).
    return _limit_used(client) + op.amount <= client.spending_limit


def _hold_insert_within_limit(client: ApiClient, hold: Hold) -> bool:
    """The hold inserted only if the client's limit covers it, its sum (`_limit_used`)
    read by the INSERT itself: one statement after the client's lock, so it sees every hold
    the lock's previous holder committed (a sum read in the lock's own statement would
    not). True when the row was inserted."""
    holds, consumed, reserved = _counted_holds(client)
    used = holds.filter(consumed | reserved).values("api_client").annotate(s=Sum("amount"))
    used_sql, used_params = used.values("s").query.sql_with_params()
    connection = transaction.get_connection()
    qn = connection.ops.quote_name
    fields = [f for f in Hold._meta.concrete_fields if not f.primary_key]
    values = [f.get_db_prep_save(f.pre_save(hold, True), connection) for f in fields]
    sql = (
        f"INSERT INTO {qn(Hold._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
        f"SELECT {', '.join(['%s'] * len(fields))} "
        f"WHERE COALESCE(({used_sql}), 0) + %s <= %s "
        f"ON CONFLICT DO NOTHING RETURNING {qn('id')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, *used_params, hold.amount, client.spending_limit])
        return cursor.fetchone() is not None


def _duplicate_returned_release(op: PaymentOperation) -> None:
    """A duplicate charge the client never asked for, returned in full by its compensation:
    its hold is released (docs/walkthrough.md, "Spending limits"). An ordinary refund never
    restores consumed allowance (refund and charge again would spend past the limit)."""
    parent = op.parent
    if not (
        op.kind == OperationKind.REFUND
        and op.is_compensation
        and parent is not None
        and parent.is_duplicate
    ):
        return
    returned = (
        PaymentOperation.objects.filter(
            parent=parent, kind=OperationKind.REFUND, outcome=Outcome.SUCCEEDED
        ).aggregate(s=Sum("amount"))["s"]
        or 0
    )
    if returned >= parent.amount:
        Hold.objects.filter(operation=parent, state=HoldState.CONSUMED).update(
            state=HoldState.RELEASED, updated_at=timezone.now()
        )


def _hold_settle(op: PaymentOperation, *, succeeded: bool) -> None:
    """consume on charge/capture success; release on failure, void, or manual failed;
    release a duplicate's once its compensation returned it in full."""
    if op.kind in (OperationKind.CHARGE, OperationKind.REFUND):
        Hold.objects.filter(operation=op, state=HoldState.RESERVED).update(
            state=HoldState.CONSUMED if succeeded else HoldState.RELEASED, updated_at=timezone.now()
        )
        if succeeded:
            _duplicate_returned_release(op)
    elif op.kind == OperationKind.AUTHORIZE and not succeeded:
        Hold.objects.filter(operation=op, state=HoldState.RESERVED).update(
            state=HoldState.RELEASED, updated_at=timezone.now()
        )
    elif op.kind == OperationKind.CAPTURE and succeeded:
        Hold.objects.filter(operation_id=op.parent_id, state=HoldState.RESERVED).update(
            state=HoldState.CONSUMED, updated_at=timezone.now()
        )
    elif op.kind == OperationKind.VOID and succeeded:
        Hold.objects.filter(operation_id=op.parent_id, state=HoldState.RESERVED).update(
            state=HoldState.RELEASED, updated_at=timezone.now()
        )


def _hold_overturn(op: PaymentOperation, *, succeeded: bool) -> None:
    """Holds follow an overturned outcome, whatever state the person's outcome left."""
    now = timezone.now()
    if op.kind in (OperationKind.CHARGE, OperationKind.REFUND):
        rows, state = (
            Hold.objects.filter(operation=op),
            (HoldState.CONSUMED if succeeded else HoldState.RELEASED),
        )
    elif op.kind == OperationKind.AUTHORIZE:
        rows, state = (
            Hold.objects.filter(operation=op),
            (HoldState.RESERVED if succeeded else HoldState.RELEASED),
        )
    elif op.kind == OperationKind.CAPTURE:
        rows, state = (
            Hold.objects.filter(operation_id=op.parent_id),
            (HoldState.CONSUMED if succeeded else HoldState.RESERVED),
        )
    else:  # void
        rows, state = (
            Hold.objects.filter(operation_id=op.parent_id),
            (HoldState.RELEASED if succeeded else HoldState.RESERVED),
        )
    rows.update(state=state, updated_at=now)
    if succeeded:
        _duplicate_returned_release(op)
    else:
        _duplicate_unreturned_consume(op)


def _duplicate_unreturned_consume(op: PaymentOperation) -> None:
    """A duplicate's return a person called succeeded (its hold released on that word),
    overturned to failed by the provider's record: the duplicate's money is still with
    the merchant, so its hold counts as consumed again until a return lands in full."""
    parent = op.parent
    if not (
        op.kind == OperationKind.REFUND
        and op.is_compensation
        and parent is not None
        and parent.is_duplicate
        and parent.outcome == Outcome.SUCCEEDED
    ):
        return
    returned = (
        PaymentOperation.objects.filter(
            parent=parent, kind=OperationKind.REFUND, outcome=Outcome.SUCCEEDED
        ).aggregate(s=Sum("amount"))["s"]
        or 0
    )
    if returned < parent.amount:
        Hold.objects.filter(operation=parent, state=HoldState.RELEASED).update(
            state=HoldState.CONSUMED, updated_at=timezone.now()
        )
