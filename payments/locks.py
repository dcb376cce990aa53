"""Row-lock helpers. Lock order, always: Quote -> the buyer (advisory) -> BuyerConfirmation
-> Purchase -> PaymentOperation -> Dispute -> ApiClient.

Two code paths never lock the same rows in a different order, so they cannot deadlock.
`of=("self",)` keeps PostgreSQL from locking joined rows. The x402 refund signer's lock
(`signer_lock`, session-level) is taken only outside any transaction: it never waits while
a row lock is held, and no row lock is waited for while it is held.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator

from django.db import connection, transaction

from .models import ApiClient, BuyerConfirmation, Dispute, PaymentOperation, Purchase, Quote

_log = logging.getLogger(__name__)


def lock_purchase(purchase_id: str) -> Purchase:
    return Purchase.objects.select_for_update(of=("self",)).get(id=purchase_id)


def lock_purchase_or_none(purchase_id: str) -> Purchase | None:
    return Purchase.objects.select_for_update(of=("self",)).filter(id=purchase_id).first()


def lock_quote_or_none(quote_id: str) -> Quote | None:
    return Quote.objects.select_for_update().filter(id=quote_id).first()


def lock_buyer_confirmation_or_none(*, code_hash: str, purchases, now) -> BuyerConfirmation | None:
    """The unused, unexpired confirmation with this code on one of `purchases`, locked."""
    return (BuyerConfirmation.objects.select_for_update()
            .filter(code_hash=code_hash, used_at__isnull=True, expires_at__gt=now,
                    purchase__in=purchases).first())


def lock_operation(operation_id: str) -> PaymentOperation:
    # django-fsm protected fields: reload with select_for_update().get(), never
    # refresh_from_db.
    return PaymentOperation.objects.select_for_update(of=("self",)).get(id=operation_id)


def lock_purchase_and_operation(operation_id: str) -> tuple[Purchase, PaymentOperation]:
    """Both locks, in the module's order (the purchase first). Raises DoesNotExist."""
    purchase_id = (PaymentOperation.objects.filter(id=operation_id)
                   .values_list("purchase_id", flat=True).get())
    purchase = lock_purchase(purchase_id)
    operation = lock_operation(operation_id)
    operation.purchase = purchase  # the locked row, not a second unlocked read
    return purchase, operation


def lock_purchases_and_operations(pairs: list[tuple[str, str]]
                                  ) -> list[tuple[Purchase, PaymentOperation]]:
    """`lock_purchase_and_operation` for a batch of (operation id, purchase id) pairs, in
    two statements: every purchase first, then every operation, each in id order (so two
    batches never wait on each other in a cycle). Pairs whose operation is gone are left
    out."""
    purchases = {p.id: p for p in Purchase.objects.select_for_update(of=("self",))
                 .filter(id__in={pid for _, pid in pairs}).order_by("id")}
    ops = {o.id: o for o in PaymentOperation.objects.select_for_update(of=("self",))
           .filter(id__in=[oid for oid, _ in pairs]).order_by("id")}
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


def lock_client(client_id: int) -> ApiClient:
    return ApiClient.objects.select_for_update(of=("self",)).get(id=client_id)


def lock_customer(api_client_id: int | None, key: str) -> None:
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
def signer_lock(address: str) -> Iterator[None]:
    """One nonce allocator per chain signer across processes: a PostgreSQL session-level
    advisory lock, held for the block (nonce read -> sign -> persist -> broadcast).

    Session-level, so it holds no transaction open (autocommit; the block's own writes
    commit as they go): call it outside any transaction, never around a receipt wait. A
    process that dies while holding it releases it with its session. An unlock that fails
    (a lost connection) never raises over the block's answer: the connection is closed,
    and the session's end releases the lock. SQLite (the embedded default) has one
    writer process: a no-op there.
    """
    if connection.vendor != "postgresql":
        yield
        return
    assert_no_transaction_outside_transaction()
    key = signer_lock_key(address)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", [key])
    try:
        yield
    finally:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [key])
        except Exception:  # noqa: BLE001 - the session's end releases it
            _log.warning("signer lock %s: unlock failed; closing the connection releases it",
                         address, exc_info=True)
            with contextlib.suppress(Exception):
                connection.close()


def assert_no_transaction_outside_transaction() -> None:
    """Provider calls are network I/O: never inside a database transaction."""
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("provider call attempted inside a database transaction")
