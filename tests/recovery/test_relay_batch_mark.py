"""A follow-up absorbed by a
handled-but-unmarked message of another drainer.

The relay now marks a batch's handled messages processed in ONE UPDATE after the last
handler of the batch (recovery/relay.py `relay_drain_once`). Until then a handled message
still looks unprocessed, so the partial unique index on unprocessed dedupe keys
(`outbox_dedupe_unprocessed`) absorbs, with ON CONFLICT DO NOTHING, any new message with
the same key. `relay_flush_pending` marks the batch first only for writes made on the
drainer's OWN thread; a write from anywhere else (a web request, a person's resume,
another worker's handler) is absorbed, and then the batch's UPDATE marks the handled row
processed: the later request is gone, though it came after the handler had run.
The window is the rest of the batch (up to
100 handlers, provider calls among them), not one handler as with a mark per message.

Reproduce: two drainers; drainer A's batch = [steps:P (handled at once), a slow message];
while the slow one runs, a request elsewhere writes run_steps_put(P) (e.g. a person's
resume after a step failed). Expected: P's steps run again. Seen: the write is absorbed,
A marks the old row, nothing is left due for P (the stalled-fulfilment sweep is the only
backstop for RUN_STEPS; OPERATION_SETTLED/DISPATCH keys have none).
Fixed: the absorbed write flags the claimed row `rerun`; the batch's mark releases it
for another run instead of marking it processed (recovery.outbox, recovery.relay).
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from recovery import outbox as outbox_mod
from recovery.models import OutboxCategory, OutboxMessage
from recovery.outbox import run_steps_put
from recovery.relay import relay_drain_once

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def recorded(monkeypatch):
    """RUN_STEPS records its purchases; NOOP {"block": true} waits for the test."""
    calls, entered, release = [], threading.Event(), threading.Event()

    def run_steps(payload):
        calls.append(payload["purchase"])

    def noop(payload):
        if payload.get("block"):
            entered.set()
            assert release.wait(15), "the test never released the slow handler"

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.RUN_STEPS), run_steps)
    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), noop)
    monkeypatch.setattr(outbox_mod, "_kick_relay", lambda: None)  # no worker: drained here
    return calls, entered, release


def _drain_in_thread(errors):
    def target():
        try:
            relay_drain_once(batch=10)
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_a_request_after_its_key_was_handled_is_not_absorbed_by_another_drainers_batch(recorded):
    calls, entered, release = recorded
    now = timezone.now()
    with transaction.atomic():
        run_steps_put(purchase_id="pur_batch_mark")
    OutboxMessage.objects.filter(dedupe_key="steps:pur_batch_mark").update(
        available_at=now - timedelta(seconds=2)
    )
    OutboxMessage.objects.create(
        category=OutboxCategory.NOOP,
        payload={"block": True},
        dedupe_key="batch-mark-slow",
        available_at=now - timedelta(seconds=1),
    )
    errors = []
    drainer = _drain_in_thread(errors)
    try:
        assert entered.wait(15), "drainer A never reached its slow message"
        assert calls == ["pur_batch_mark"]  # A handled steps:P ...
        # ... and, while A's batch runs on, a person resumes P (another request).
        with transaction.atomic():
            run_steps_put(purchase_id="pur_batch_mark")
        waiting = OutboxMessage.objects.filter(dedupe_key="steps:pur_batch_mark").count()
    finally:
        release.set()
        drainer.join(20)
    assert not errors, errors

    relay_drain_once(batch=10)  # whatever is due now
    due_left = OutboxMessage.objects.filter(
        dedupe_key="steps:pur_batch_mark", processed_at__isnull=True
    ).count()
    print(
        f"rows for steps:P after the resume={waiting} handler runs={calls} "
        f"unprocessed left={due_left}"
    )
    assert calls == ["pur_batch_mark", "pur_batch_mark"], (
        f"the resume written after the first run was absorbed: runs={calls}, "
        f"rows for the key at the resume={waiting}"
    )


# -- held: a lease that runs out mid-batch, a second drainer re-claims ---------------------

from payments import services as pay  # noqa: E402
from payments.enums import Outcome  # noqa: E402
from recovery.outbox import dispatch_put  # noqa: E402


def _lease_runs_out(*messages: OutboxMessage) -> None:
    """The end of a claim's lease, moved into the past: what waiting out the lease does,
    without betting on how long the machine takes to reach the next line."""
    rows = OutboxMessage.objects.filter(claimed_until__isnull=False)
    if messages:
        rows = rows.filter(pk__in=[m.pk for m in messages])
    rows.update(claimed_until=timezone.now() - timedelta(seconds=1))


def test_a_refund_dispatch_reclaimed_after_its_lease_refunds_once(
    settings, monkeypatch, api_client, new_purchase, pay_now, localstripe
):  # noqa: F811
    # Drainer A claims [refund dispatch]; its handler stalls past its lease; drainer B
    # re-claims the same message (attempts 2) and dispatches; then A's handler goes on.
    # The lease is long (no drainer loses it to a slow machine) and runs out when the test
    # says so: its end is moved into the past while A stalls.
    settings.OUTBOX_LEASE_SECONDS = 60
    monkeypatch.setattr(outbox_mod, "_kick_relay", lambda: None)
    purchase = new_purchase()
    payment = pay_now(purchase)
    assert payment.outcome == Outcome.SUCCEEDED, payment.outcome
    refund = pay.refund_request(
        purchase_id=purchase.pk, amount=500, api_client=api_client, compensation=True
    )
    OutboxMessage.objects.filter(category=OutboxCategory.DISPATCH).delete()
    with transaction.atomic():
        dispatch_put(operation_id=refund.pk)
    message = OutboxMessage.objects.get(dedupe_key=f"dispatch:{refund.pk}")

    real = outbox_mod._HANDLERS[int(OutboxCategory.DISPATCH)]
    runs, reclaimed, entered = [], threading.Event(), threading.Event()

    def stalling(payload):
        runs.append(threading.current_thread().name)
        if len(runs) == 1:
            entered.set()  # A: stall until B has re-claimed the message
            assert reclaimed.wait(15), "no second drainer re-claimed the message"
        real(payload)

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.DISPATCH), stalling)
    errors = []
    a = _drain_in_thread(errors)
    try:
        assert entered.wait(15), "drainer A never ran the dispatch"
        _lease_runs_out(message)  # B claims again
        relay_drain_once(batch=10)  # other rows (the purchase's events) drain too
        message.refresh_from_db()
        assert message.attempts == 2, message.attempts
    finally:
        reclaimed.set()
        a.join(20)
    assert not errors, errors
    message.refresh_from_db()
    refund.refresh_from_db()
    refunds = localstripe.refunds_for(payment.provider_reference)
    print(
        f"handler runs={len(runs)} attempts={message.attempts} refunds at localstripe="
        f"{len(refunds)} refund outcome={refund.outcome} processed={message.processed_at}"
    )
    assert len(runs) == 2
    assert len(refunds) == 1
    assert refund.outcome == Outcome.SUCCEEDED
    assert message.processed_at is not None


# -- held: the connection is lost between the claim and the mark --------------------------

import psycopg  # noqa: E402
from django.db import OperationalError  # noqa: E402


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "plain"])
def test_a_batch_whose_mark_lost_its_connection_comes_back_after_the_lease(
    settings, monkeypatch, prepared
):
    settings.OUTBOX_LEASE_SECONDS = 60  # runs out when the test says so (_lease_runs_out)
    settings.DATABASE_PREPARED_STATEMENTS = prepared
    runs, kill = [], [False]

    def noop(payload):
        runs.append(payload["k"])
        if payload["k"] == 2 and kill[0]:  # the batch's last handler, once
            kill[0] = False
            # The drainer's connection dies after its handlers, before the batch's mark.
            pid = connection.connection.info.backend_pid
            with psycopg.connect(**connection.get_connection_params(), autocommit=True) as c:
                c.execute("SELECT pg_terminate_backend(%s)", [pid])

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), noop)
    for k in range(3):
        OutboxMessage.objects.create(
            category=OutboxCategory.NOOP, payload={"k": k}, dedupe_key=f"lost:{k}"
        )
    relay_drain_once(batch=10)  # warm: the claim is prepared on this connection
    assert runs == [0, 1, 2]
    OutboxMessage.objects.update(processed_at=None, claimed_until=None)
    runs.clear()
    kill[0] = True

    with pytest.raises(OperationalError):
        relay_drain_once(batch=10)
    # What a Celery worker does at the next task (Django fixup): drop the dead connection.
    connection.close_if_unusable_or_obsolete()
    marked = OutboxMessage.objects.filter(processed_at__isnull=False).count()
    assert marked == 0, "a mark on a dead connection cannot have committed"
    assert relay_drain_once(batch=10) == 0, "re-claimed inside the lease"
    _lease_runs_out()
    assert relay_drain_once(batch=10) == 3
    left = OutboxMessage.objects.filter(processed_at__isnull=True).count()
    attempts = sorted(OutboxMessage.objects.values_list("attempts", flat=True))
    print(f"prepared={prepared} handler runs={runs} unprocessed={left} attempts={attempts}")
    assert left == 0
    assert attempts == [3, 3, 3]  # warm run, killed run, run after the lease
    assert sorted(runs) == [0, 0, 1, 1, 2, 2]


# -- held: three drainers at once, each message handled once ------------------------------


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "plain"])
def test_three_drainers_at_once_handle_every_message_exactly_once(settings, monkeypatch, prepared):
    settings.DATABASE_PREPARED_STATEMENTS = prepared
    seen, lock = [], threading.Lock()

    def noop(payload):
        with lock:
            seen.append(payload["k"])

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), noop)
    OutboxMessage.objects.bulk_create(
        [
            OutboxMessage(category=OutboxCategory.NOOP, payload={"k": k}, dedupe_key=f"three:{k}")
            for k in range(600)
        ]
    )
    barrier, errors = threading.Barrier(3), []

    def drain():
        try:
            barrier.wait(10)
            while relay_drain_once(batch=20):
                pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=drain) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    twice = len(seen) - len(set(seen))
    left = OutboxMessage.objects.filter(processed_at__isnull=True).count()
    attempts = set(OutboxMessage.objects.values_list("attempts", flat=True))
    print(
        f"prepared={prepared} handled={len(seen)} twice={twice} unprocessed={left} "
        f"attempts={attempts}"
    )
    assert sorted(seen) == list(range(600))
    assert left == 0 and attempts == {1}


# -- held: a handler that escapes with a BaseException mid-batch ---------------------------


def test_a_batch_cut_short_by_a_base_exception_marks_what_ran_and_loses_nothing(
    settings, monkeypatch
):
    # SystemExit/KeyboardInterrupt are not handler failures (not caught, not backed off):
    # the batch's earlier successes are marked, the rest come back after the lease.
    settings.OUTBOX_LEASE_SECONDS = 60  # runs out when the test says so (_lease_runs_out)
    runs, cut = [], [True]

    def noop(payload):
        runs.append(payload["k"])
        if payload["k"] == 1 and cut[0]:
            cut[0] = False
            raise SystemExit("worker shutting down")

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), noop)
    now = timezone.now()
    for k in range(4):
        OutboxMessage.objects.create(
            category=OutboxCategory.NOOP,
            payload={"k": k},
            dedupe_key=f"cut:{k}",
            available_at=now - timedelta(seconds=10 - k),
        )
    with pytest.raises(SystemExit):
        relay_drain_once(batch=10)
    processed = sorted(
        OutboxMessage.objects.filter(processed_at__isnull=False).values_list(
            "payload__k", flat=True
        )
    )
    assert processed == [0]
    assert relay_drain_once(batch=10) == 0, "re-claimed inside the lease"
    _lease_runs_out()
    assert relay_drain_once(batch=10) == 3
    left = OutboxMessage.objects.filter(processed_at__isnull=True).count()
    print(f"runs={runs} marked after the cut={processed} unprocessed at the end={left}")
    assert left == 0 and runs == [0, 1, 1, 2, 3]


def test_a_flush_inside_a_handler_transaction_that_rolls_back_still_marks_the_batch(monkeypatch):
    # m0 succeeds; m1's handler writes a follow-up (the relay flushes m0's mark inside m1's
    # transaction) and then fails: the transaction, flush included, rolls back. m0 must
    # still end processed (the batch's final UPDATE), m1 backed off, the follow-up absent.
    from recovery.outbox import outbox_put

    def noop(payload):
        if payload["k"] == 1:
            with transaction.atomic():
                outbox_put(
                    category=OutboxCategory.NOOP, payload={"k": 9}, dedupe_key="rollback:follow-up"
                )
                raise RuntimeError("the handler fails after its write")

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), noop)
    monkeypatch.setattr(outbox_mod, "_kick_relay", lambda: None)
    now = timezone.now()
    for k in range(3):
        OutboxMessage.objects.create(
            category=OutboxCategory.NOOP,
            payload={"k": k},
            dedupe_key=f"rollback:{k}",
            available_at=now - timedelta(seconds=10 - k),
        )
    assert relay_drain_once(batch=10) == 3
    rows = {m.dedupe_key: m for m in OutboxMessage.objects.all()}
    assert rows["rollback:0"].processed_at is not None
    assert rows["rollback:2"].processed_at is not None
    failed = rows["rollback:1"]
    assert failed.processed_at is None and "RuntimeError" in failed.last_error
    assert "rollback:follow-up" not in rows
