"""Row-lock helpers. Lock order, always: Quote -> the buyer (advisory) -> BuyerConfirmation
-> Purchase -> PaymentOperation -> Dispute -> ApiClient.

Two code paths never lock the same rows in a different order, so they cannot deadlock.
`of=("self",)` keeps PostgreSQL from locking joined rows. The x402 refund signer's lock
(`signer_lock`, session-level) is taken only outside any transaction: it never waits while
a row lock is held. Inside it, a refund takes only its own operation's row lock, for its
claim check (the compare-and-set before signing and before broadcasting) and between its
wait slices: nobody waits for the signer lock while holding a row lock, so the order is
always signer lock -> row lock and there is no cycle.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator

from django.db import OperationalError, connection, transaction
from django.db.models.expressions import BaseExpression

from .models import ApiClient, BuyerConfirmation, Dispute, PaymentOperation, Purchase, Quote

_log = logging.getLogger(__name__)


def lock_purchase(purchase_id: str) -> Purchase:
    return Purchase.objects.select_for_update(of=("self",)).get(id=purchase_id)


def lock_purchase_or_none(purchase_id: str, *, with_quote: bool = False) -> Purchase | None:
    """`with_quote`: its quote read in the same statement (the quote row is not locked)."""
    purchases = Purchase.objects.select_for_update(of=("self",))
    if with_quote:
        purchases = purchases.select_related("quote")
    return purchases.filter(id=purchase_id).first()


def lock_quote_or_none(quote_id: str) -> Quote | None:
    return Quote.objects.select_for_update().filter(id=quote_id).first()


def lock_buyer_confirmation_or_none(*, code_hash: str, purchases, now) -> BuyerConfirmation | None:
    """The unused, unexpired confirmation with this code on one of `purchases`, locked."""
    return (
        BuyerConfirmation.objects.select_for_update()
        .filter(
            code_hash=code_hash, used_at__isnull=True, expires_at__gt=now, purchase__in=purchases
        )
        .first()
    )


def lock_operation(operation_id: str, **reads: BaseExpression) -> PaymentOperation:
    """`reads`: expressions read in the same statement, set on the operation by name (as
    `lock_purchase_or_none`'s: they see the rows as the statement began)."""
    # django-fsm protected fields: reload with select_for_update().get(), never
    # refresh_from_db.
    operations = PaymentOperation.objects.select_for_update(of=("self",))
    if reads:
        operations = operations.annotate(**reads)
    return operations.get(id=operation_id)


def lock_purchase_and_operation(
    operation_id: str, *, purchase_id: str = "", **reads: BaseExpression
) -> tuple[Purchase, PaymentOperation]:
    """Both locks, in the module's order (the purchase first). Raises DoesNotExist.
    `purchase_id`: the operation's purchase when the caller already read it (an operation
    never changes purchase), which saves a read. `reads`: read with the operation's lock,
    which is taken once the purchase's is held, so they see every change committed under
    the purchase's lock (a sibling operation's outcome)."""
    if not purchase_id:
        purchase_id = (
            PaymentOperation.objects.filter(id=operation_id)
            .values_list("purchase_id", flat=True)
            .get()
        )
    purchase = lock_purchase(purchase_id)
    operation = lock_operation(operation_id, **reads)
    operation.purchase = purchase  # the locked row, not a second unlocked read
    return purchase, operation


def lock_purchases_and_operations(
    pairs: list[tuple[str, str]],
) -> list[tuple[Purchase, PaymentOperation]]:
    """`lock_purchase_and_operation` for a batch of (operation id, purchase id) pairs, in
    two statements: every purchase first, then every operation, each in id order (so two
    batches never wait on each other in a cycle). Pairs whose operation is gone are left
    out."""
    purchases = {
        p.id: p
        for p in Purchase.objects.select_for_update(of=("self",))
        .filter(id__in={pid for _, pid in pairs})
        .order_by("id")
    }
    ops = {
        o.id: o
        for o in PaymentOperation.objects.select_for_update(of=("self",))
        .filter(id__in=[oid for oid, _ in pairs])
        .order_by("id")
    }
    locked = []
    for op_id, _ in pairs:
        op = ops.get(op_id)
        if op is None or op.purchase_id not in purchases:
            continue
        op.purchase = purchases[op.purchase_id]
        locked.append((op.purchase, op))
    return locked


def lock_dispute(dispute_id: str):
    """The dispute row, or None (the caller already holds its purchase's lock)."""

    return Dispute.objects.select_for_update(of=("self",)).filter(id=dispute_id).first()


def lock_client(client_id: str) -> ApiClient:
    return ApiClient.objects.select_for_update(of=("self",)).get(id=client_id)


def lock_customer(api_client_id: str | None, key: str) -> None:
    """One buyer (an API client's normalised customer key), for the rest of the transaction.

    Serialises "is there an unresolved or duplicate purchase?" + insert across processes
    (a transaction-level advisory lock: there is no row to lock before the purchase
    exists). Taken after the quote's row lock. SQLite's IMMEDIATE transactions already
    serialise writers.
    """
    conn = transaction.get_connection()
    if conn.vendor == "postgresql":
        scope = f"{api_client_id if api_client_id is not None else '-'}:{key}"
        lock = int.from_bytes(hashlib.sha256(scope.encode()).digest()[:8], "big", signed=True)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [lock])


def signer_lock_key(address: str) -> int:
    """The stable signed 64-bit advisory-lock key of one chain signer's nonces."""
    scope = f"x402-signer-nonce:{address.lower()}"
    return int.from_bytes(hashlib.sha256(scope.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def signer_lock(
    address: str,
    *,
    while_waiting: Callable[[], None] | None = None,
    wait_slice_seconds: float = 5.0,
) -> Iterator[None]:
    """One nonce allocator per chain signer across processes: a PostgreSQL session-level
    advisory lock, held for the block (nonce read -> sign -> persist -> broadcast).

    Session-level, so it holds no transaction open (autocommit; the block's own writes
    commit as they go): call it outside any transaction, never around a receipt wait. A
    process that dies while holding it releases it with its session. An unlock that fails
    (a lost connection) never raises over the block's answer: the connection is closed,
    and the session's end releases the lock. SQLite (the embedded default) has one
    writer process: a no-op there.

    `while_waiting`: the wait is a live worker's, not a dead one's (so the
    dead-dispatch sweep does not take a refund queued behind another for dead). The lock is then
    waited for in slices of `wait_slice_seconds` (each a real queued wait, `lock_timeout`),
    and `while_waiting()` runs between slices, outside any transaction: it renews the
    waiter's lease, and raises to give the wait up (the claim was lost) — the exception
    leaves this function with the lock not taken.
    """
    if connection.vendor != "postgresql":
        if while_waiting is not None:
            while_waiting()
        yield
        return
    assert_outside_transaction()
    key = signer_lock_key(address)
    if while_waiting is None:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", [key])
    else:
        _signer_lock_in_slices(key, while_waiting, wait_slice_seconds)
    try:
        yield
    finally:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [key])
        except Exception:  # noqa: BLE001 - the session's end releases it
            _log.warning(
                "signer lock %s: unlock failed; closing the connection releases it",
                address,
                exc_info=True,
            )
            with contextlib.suppress(Exception):
                connection.close()


def _signer_lock_in_slices(
    key: int, while_waiting: Callable[[], None], slice_seconds: float
) -> None:
    """pg_advisory_lock under a session `lock_timeout` (autocommit: a timed-out statement
    aborts no transaction), `while_waiting()` between slices. The timeout is reset before
    returning or raising, so the session's later statements keep the default."""
    millis = max(50, int(slice_seconds * 1000))
    try:
        while True:
            with connection.cursor() as cur:
                cur.execute(f"SET lock_timeout = {millis}")
                try:
                    cur.execute("SELECT pg_advisory_lock(%s)", [key])
                    return
                except OperationalError as exc:
                    if getattr(exc.__cause__, "sqlstate", None) != "55P03":
                        raise  # not our lock_timeout: the session is in trouble
            while_waiting()
    finally:
        with contextlib.suppress(Exception), connection.cursor() as cur:
            cur.execute("RESET lock_timeout")


def assert_outside_transaction() -> None:
    """Provider calls are network I/O: never inside a database transaction.

    A rolled-back test (django.test.TestCase, pytest-django's `db`) runs inside atomic
    blocks of its own; Django marks them (`_from_testcase`, which it reads itself to let a
    durable block nest in them). They are the test's watermark: only a block opened above
    them is a transaction the code opened. Nothing outside django.test sets the mark, so in
    production every open block counts, as before.
    """
    conn = transaction.get_connection()
    if conn.in_atomic_block and not _only_test_case_blocks(conn):
        raise RuntimeError("provider call attempted inside a database transaction")


def _only_test_case_blocks(conn) -> bool:
    return bool(conn.atomic_blocks) and all(
        getattr(block, "_from_testcase", False) for block in conn.atomic_blocks
    )
