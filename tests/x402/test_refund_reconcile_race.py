"""An x402 refund is never settled `failed` while its transfer can still
be signed and sent — on the real chain.

An approved refund claims its send, then waits for the refund signer's lock (another
refund of the signer holds it, here: this test's own session) or for a slow RPC. Nothing
may conclude "nothing moved" in that window: an on-demand reconcile (API, console,
service) refuses a `dispatching` operation, the dead-dispatch sweep sees a live lock wait
(its lease is kept while it waits), and the signer itself signs only after a
compare-and-set under the operation's row lock (still `dispatching`, same claim), and
broadcasts only after storing the hash under the same check. So a refund someone else
settled meanwhile sends nothing, and a refund that waited sends exactly once, is booked
once, and leaves no room for a second refund of the same amount.

The lock is held for real (a PostgreSQL advisory lock, `payments.locks.signer_lock`),
the refund is dispatched on another thread (its own database session), and the slow RPC
is a real pause after the signer's nonce read (the hook of test_refund_nonce_race)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.utils import timezone

from payments import services
from payments.locks import signer_lock
from payments.models import PaymentOperation, ProviderCall, X402RefundTransfer
from payments.providers.x402 import get_refund_sender
from recovery.models import LedgerEntry
from support.access import Role, ensure_groups
from support.services import ConsoleError, operation_reconcile_by_user
from tests.outbox import settle_outbox
from tests.x402.test_refund_nonce_race import (
    _outcome_of,
    _pay,
    _race_after_the_nonce_read,
    _signer_lock_now,
    _start_in_another_process,
)

pytestmark = pytest.mark.django_db(transaction=True)

PRICE = 1250  # the report, in cents
PRICE_ATOMIC = PRICE * 10**4  # in USDC's 6 decimals
FUNDS = 1_000 * 10**6


@pytest.fixture
def support_user(db) -> User:
    ensure_groups()
    user = User.objects.create_user(username="sam-support", password="pw")
    user.groups.add(Group.objects.get(name=Role.SUPPORT))
    return user


def _dispatch_on_another_thread(op_id: str) -> tuple[threading.Thread, dict]:
    """What a worker does with an approved refund, on its own database session."""
    box: dict = {}

    def run() -> None:
        try:
            box["op"] = services.operation_dispatch(operation_id=op_id)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc
        finally:
            connection.close()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, box


def _until_it_waits_for_the_signer(address: str, worker: threading.Thread) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _signer_lock_now(address)[1] >= 1:
            return
        assert worker.is_alive(), "the refund's dispatch ended before it waited for the lock"
        time.sleep(0.05)
    raise AssertionError("the refund never waited for the signer's lock")


def _refused(fn) -> str:
    """The refusal's code, or the outcome it settled (the defect)."""
    try:
        return f"settled:{fn().outcome}"
    except (services.DomainError, ConsoleError) as exc:
        return exc.code


def _approved_api_refund(shop, purchase, approver) -> PaymentOperation:
    r = shop.post(f"purchases/{purchase['id']}/refunds", {})
    assert r.status_code in (201, 202), r.content
    refund = PaymentOperation.objects.get(purchase_id=purchase["id"], kind="refund")
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    return PaymentOperation.objects.get(id=refund.id)


def _approved_refund(purchase, people) -> PaymentOperation:
    _, requester, approver = people
    refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    return PaymentOperation.objects.get(id=refund.id)


def _refund_ledger_rows(refund) -> int:
    return LedgerEntry.objects.filter(operation_id=refund.id, entry_type="refund").count()


def _second_refund_of_the_same_amount(purchase, requester) -> str:
    try:
        services.refund_request(purchase_id=purchase["id"], amount=PRICE, acting_user=requester)
    except services.DomainError as exc:
        return exc.code
    return "approved_for_request"


def _paid_once_back(chain, payer, refund, purchase, people) -> None:
    """After the wait: exactly one transfer back, the refund succeeded (by the chain), the
    ledger booked it once, and no room is left for a second refund of the same amount."""
    done = PaymentOperation.objects.get(id=refund.id)
    assert (done.outcome, done.verification) == ("succeeded", "provider"), (
        done.outcome,
        done.reason,
    )
    assert chain.transfers_back(payer.address) == 1
    assert chain.balance(payer.address) == FUNDS
    row = X402RefundTransfer.objects.get(operation=refund)
    assert row.transaction_hash and row.block_number
    assert (
        ProviderCall.objects.filter(operation=refund, purpose="dispatch", step="refund").count()
        == 1
    )
    assert _refund_ledger_rows(refund) == 2  # one double entry
    assert done.purchase.status == "refunded"
    assert (
        _second_refund_of_the_same_amount(purchase, people.requester) == "refund_exceeds_refundable"
    )
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").count() == 1
    assert chain.transfers_back(payer.address) == 1


def test_a_refund_waiting_for_the_signer_is_not_settled_by_an_on_demand_reconcile(
    shop, report, chain, people, support_user
):
    # given a paid x402 purchase, and its refund requested over the API and approved
    payer = chain.new_payer(FUNDS)
    purchase = _pay(shop, report, payer)
    refund = _approved_api_refund(shop, purchase, people.approver)
    sender = get_refund_sender()
    # and another refund of the signer holding the signer's lock (this test's session)
    with signer_lock(sender.address):
        worker, box = _dispatch_on_another_thread(refund.id)
        _until_it_waits_for_the_signer(sender.address, worker)
        waiting = PaymentOperation.objects.get(id=refund.id)
        assert waiting.outcome == "dispatching"

        # when the refund is reconciled on demand while it waits: the API, the console,
        # the service
        api = shop.post(f"operations/{refund.id}/reconcile", key=None)
        console = _refused(
            lambda: operation_reconcile_by_user(
                operation_id=refund.id, user=support_user, reason="customer asks"
            )
        )
        service = _refused(
            lambda: services.operation_reconcile(operation_id=refund.id, actor="test")
        )

        # then each refuses (a send can still happen), the chain read itself gives no
        # verdict, and nothing was settled
        assert services.operation_read_canonical(operation_id=refund.id) is None
        assert (api.status_code, api.json().get("code")) == (409, "dispatch_in_progress"), (
            api.content
        )
        assert (console, service) == ("dispatch_in_progress", "dispatch_in_progress")
        still = PaymentOperation.objects.get(id=refund.id)
        assert (still.outcome, still.reason) == ("dispatching", "")
        assert not X402RefundTransfer.objects.get(operation=refund).transaction_hash
        assert chain.transfers_back(payer.address) == 0
        assert worker.is_alive()
    # when the signer's lock is released
    worker.join(60)
    settle_outbox()

    # then the refund sent exactly once and succeeded, booked once, and no second refund
    assert "error" not in box, box.get("error")
    assert box["op"].outcome == "succeeded"
    _paid_once_back(chain, payer, refund, purchase, people)


def test_the_dead_dispatch_sweep_leaves_a_refund_that_waits_for_the_signer(
    agent, report, chain, people, settings
):
    # given a short dispatch lease, and an approved refund waiting for the signer's lock
    # (held by another refund, this test's session) far longer than that lease
    settings.DISPATCH_LEASE_SECONDS = 2
    payer = chain.new_payer(FUNDS)
    purchase = _pay(agent, report, payer)
    refund = _approved_refund(purchase, people)
    sender = get_refund_sender()
    with signer_lock(sender.address):
        worker, box = _dispatch_on_another_thread(refund.id)
        _until_it_waits_for_the_signer(sender.address, worker)
        time.sleep(settings.DISPATCH_LEASE_SECONDS + 2)

        # when the dead-dispatch sweep runs (the beat job), then the reconciler
        from recovery.reconciler import sweep_dead_dispatches

        swept = sweep_dead_dispatches()
        reconciled = _refused(
            lambda: services.operation_reconcile(operation_id=refund.id, actor="reconciler")
        )

        # then the live wait was not taken for a dead worker, and nothing was settled
        assert swept == 0
        assert reconciled == "dispatch_in_progress"
        still = PaymentOperation.objects.get(id=refund.id)
        assert still.outcome == "dispatching"
        assert worker.is_alive()
    # when the signer's lock is released
    worker.join(60)
    settle_outbox()

    # then it sent exactly once, succeeded, booked once, and no second refund fits
    assert "error" not in box, box.get("error")
    assert box["op"].outcome == "succeeded"
    _paid_once_back(chain, payer, refund, purchase, people)


def test_a_refund_settled_by_someone_else_before_it_is_signed_sends_nothing(
    agent, report, chain, people, settings, monkeypatch
):
    # given a short dispatch lease and an approved refund
    settings.DISPATCH_LEASE_SECONDS = 1
    payer = chain.new_payer(FUNDS)
    purchase = _pay(agent, report, payer)
    refund = _approved_refund(purchase, people)
    sender = get_refund_sender()
    signer_nonce = chain.w3.eth.get_transaction_count(sender.address, "pending")
    seen: dict = {}

    def the_rpc_stalls_and_someone_else_settles_it() -> None:
        # Right after the signer's nonce read (a slow node), the lease runs out: the
        # sweep takes the worker for dead, and the reconciler settles what it reads.
        time.sleep(settings.DISPATCH_LEASE_SECONDS + 0.5)
        seen["swept"] = services.operations_sweep_dead_dispatches()
        seen["read"] = _refused(
            lambda: services.operation_reconcile(operation_id=refund.id, actor="reconciler")
        )

    _race_after_the_nonce_read(monkeypatch, sender, the_rpc_stalls_and_someone_else_settles_it)

    # when the refund is dispatched
    services.operation_dispatch(operation_id=refund.id)
    settle_outbox()

    # then the operation was settled by the others (nothing had been signed: it cannot
    # move any more) and the signer, no longer holding the claim, signed and sent nothing
    assert seen == {"swept": 1, "read": "settled:failed"}
    done = PaymentOperation.objects.get(id=refund.id)
    assert done.outcome == "failed"
    assert chain.transfers_back(payer.address) == 0
    assert chain.balance(payer.address) == FUNDS - PRICE_ATOMIC
    assert chain.w3.eth.get_transaction_count(sender.address, "pending") == signer_nonce
    assert not X402RefundTransfer.objects.get(operation=refund).transaction_hash
    assert _refund_ledger_rows(refund) == 0
    call = ProviderCall.objects.get(operation=refund, purpose="dispatch", step="refund")
    assert "aborted" in call.safe_fields["detail"], call.safe_fields
    # and since nothing moved, the purchase's room is honestly free again: one new
    # refund moves the money back once
    again = _approved_refund(purchase, people)
    assert services.operation_dispatch(operation_id=again.id).outcome == "succeeded"
    settle_outbox()
    assert chain.transfers_back(payer.address) == 1
    assert chain.balance(payer.address) == FUNDS


def test_a_worker_frozen_while_it_waits_for_the_signer_sends_nothing_once_swept(
    agent, report, chain, people
):
    # given an approved refund whose worker — another process, with a 2-s dispatch lease —
    # waits for the signer's lock (held by another refund, this test's session)
    payer = chain.new_payer(FUNDS)
    purchase = _pay(agent, report, payer)
    refund = _approved_refund(purchase, people)
    sender = get_refund_sender()
    signer_nonce = chain.w3.eth.get_transaction_count(sender.address, "pending")
    worker = None
    try:
        with signer_lock(sender.address):
            worker = _start_in_another_process(refund, DISPATCH_LEASE_SECONDS="2")
            deadline = time.monotonic() + 60
            while _signer_lock_now(sender.address)[1] < 1:
                assert worker.poll() is None and time.monotonic() < deadline, "never waited"
                time.sleep(0.05)
            # and that worker freezes (a stalled VM, a stopped process): it renews nothing
            os.kill(worker.pid, signal.SIGSTOP)
            # its lease (2 s) runs out: wait on the deadline it stored, not a fixed sleep
            deadline = time.monotonic() + 30
            while PaymentOperation.objects.filter(
                pk=refund.pk, dispatch_deadline__gte=timezone.now()
            ).exists():
                assert time.monotonic() < deadline, "the frozen worker's lease never ran out"
                time.sleep(0.1)
            # when the sweep takes it for dead and the reconciler reads it back
            swept = services.operations_sweep_dead_dispatches()
            read = _refused(
                lambda: services.operation_reconcile(operation_id=refund.id, actor="reconciler")
            )
    finally:
        # and the signer's lock is free when the worker wakes up
        if worker is not None:
            os.kill(worker.pid, signal.SIGCONT)
    woke = _outcome_of(worker)
    settle_outbox()

    # then the refund was settled failed by the others while nothing had been signed,
    # and the woken worker, no longer holding its claim, signed and sent nothing
    assert (swept, read, woke) == (1, "settled:failed", "failed")
    assert chain.transfers_back(payer.address) == 0
    assert chain.balance(payer.address) == FUNDS - PRICE_ATOMIC
    assert chain.w3.eth.get_transaction_count(sender.address, "pending") == signer_nonce
    assert not X402RefundTransfer.objects.get(operation=refund).transaction_hash
    call = ProviderCall.objects.get(operation=refund, purpose="dispatch", step="refund")
    assert "aborted" in call.safe_fields["detail"], call.safe_fields
    assert _refund_ledger_rows(refund) == 0
