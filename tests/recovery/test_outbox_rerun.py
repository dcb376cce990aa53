"""A write whose key is pending in a claimed (being handled) message runs once more.

The partial unique index on unprocessed dedupe keys absorbs a duplicate. If the pending
row is claimed, its handler may have run before the write's state: the insert flags it
`rerun` and the relay's mark releases it (due now, attempts kept) instead of marking it
processed. A duplicate of an unclaimed row stays absorbed (it runs later and sees the
latest state). On SQLite the same statements run (the ORM claim and mark).
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from recovery import outbox as outbox_mod
from recovery.models import OutboxCategory, OutboxMessage
from recovery.outbox import outbox_batch, outbox_put
from recovery.relay import relay_drain_once

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runs(monkeypatch):
    seen = []
    monkeypatch.setitem(
        outbox_mod._HANDLERS, int(OutboxCategory.NOOP), lambda payload: seen.append(payload["k"])
    )
    monkeypatch.setattr(outbox_mod, "_kick_relay", lambda: None)
    return seen


def _put(key, k=0):
    with transaction.atomic():
        outbox_put(category=OutboxCategory.NOOP, payload={"k": k}, dedupe_key=key)


def test_a_duplicate_of_an_unclaimed_pending_message_is_absorbed(runs):
    _put("dup")
    _put("dup", k=1)
    row = OutboxMessage.objects.get(dedupe_key="dup")
    assert row.rerun is False and row.payload == {"k": 0}
    assert relay_drain_once() == 1
    row.refresh_from_db()
    assert runs == [0] and row.processed_at is not None


def test_a_duplicate_of_a_claimed_message_releases_it_for_one_more_run(runs):
    _put("claimed")
    lease = timezone.now() + timedelta(seconds=60)
    OutboxMessage.objects.filter(dedupe_key="claimed").update(claimed_until=lease, attempts=1)
    _put("claimed", k=1)  # while "handled" elsewhere
    row = OutboxMessage.objects.get(dedupe_key="claimed")
    assert row.rerun is True

    # The drainer holding it marks its batch: the row is released, not processed.
    from recovery.relay import _succeed_all

    before = timezone.now()
    _succeed_all([row.id], lease)
    row.refresh_from_db()
    assert row.processed_at is None and row.claimed_until is None and row.rerun is False
    assert row.attempts == 1 and row.available_at >= before

    assert relay_drain_once() == 1  # due at once: runs again, then processed
    row.refresh_from_db()
    assert runs == [0] and row.processed_at is not None and row.attempts == 2
    assert OutboxMessage.objects.filter(dedupe_key="claimed").count() == 1


def test_a_failed_run_clears_the_flag(monkeypatch):
    monkeypatch.setattr(outbox_mod, "_kick_relay", lambda: None)

    def fails(payload):
        _put_elsewhere("failing")  # a write with its key while it is claimed
        raise RuntimeError("handler failed")

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), fails)
    _put("failing")
    assert relay_drain_once() == 1
    row = OutboxMessage.objects.get(dedupe_key="failing")
    assert row.processed_at is None and row.rerun is False and "RuntimeError" in row.last_error
    assert row.available_at > timezone.now()  # backed off: its next run sees the write


def _put_elsewhere(key, k=1):
    """A write from another thread (another request): the relay's flush does not run."""
    errors = []

    def target():
        try:
            _put(key, k)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(15)
    assert not errors, errors


@pytest.mark.claims_left_by_the_test
def test_a_row_released_by_a_flush_and_claimed_again_is_left_to_its_new_drainer(monkeypatch):
    # m0 handled; during m1 a write elsewhere flags m0, then m1's own write flushes the
    # batch's marks (m0 released); another drainer claims m0 again. The batch's final
    # mark must not touch m0: it belongs to its new drainer now.
    monkeypatch.setattr(outbox_mod, "_kick_relay", lambda: None)
    other_lease = timezone.now() + timedelta(seconds=120)

    def noop(payload):
        if payload["k"] == 1:
            _put_elsewhere("flush:0")
            _put("flush:follow-up", k=9)  # own thread: flushes m0's mark (released)
            m0 = OutboxMessage.objects.get(dedupe_key="flush:0")
            assert m0.processed_at is None and m0.claimed_until is None
            OutboxMessage.objects.filter(id=m0.id).update(claimed_until=other_lease, attempts=2)

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), noop)
    now = timezone.now()
    for k in range(2):
        OutboxMessage.objects.create(
            category=OutboxCategory.NOOP,
            payload={"k": k},
            dedupe_key=f"flush:{k}",
            available_at=now - timedelta(seconds=10 - k),
        )
    assert relay_drain_once(batch=10) == 2
    rows = {m.dedupe_key: m for m in OutboxMessage.objects.all()}
    m0 = rows["flush:0"]
    assert m0.processed_at is None and m0.claimed_until == other_lease and m0.attempts == 2
    assert rows["flush:1"].processed_at is not None
    assert rows["flush:follow-up"].processed_at is None


@pytest.mark.claims_left_by_the_test
def test_one_batched_insert_with_a_key_twice_keeps_the_first(runs):
    _put("batch:claimed")
    OutboxMessage.objects.filter(dedupe_key="batch:claimed").update(
        claimed_until=timezone.now() + timedelta(seconds=60)
    )
    with transaction.atomic(), outbox_batch():
        for k in range(3):
            outbox_put(category=OutboxCategory.NOOP, payload={"k": k}, dedupe_key="batch:a")
            outbox_put(category=OutboxCategory.NOOP, payload={"k": k}, dedupe_key="batch:claimed")
        outbox_put(category=OutboxCategory.NOOP, payload={"k": 7}, dedupe_key="batch:b")
    rows = {m.dedupe_key: m for m in OutboxMessage.objects.all()}
    assert set(rows) == {"batch:a", "batch:b", "batch:claimed"}
    assert rows["batch:a"].payload == {"k": 0} and rows["batch:a"].rerun is False
    assert rows["batch:claimed"].rerun is True


SQLITE_SCRIPT = r"""
from datetime import timedelta
from django.db import connection, transaction
from django.utils import timezone
from recovery import outbox as outbox_mod
from recovery.models import OutboxCategory, OutboxMessage
from recovery.outbox import outbox_batch, outbox_put
from recovery.relay import _succeed_all, relay_drain_once

assert connection.vendor == "sqlite", connection.vendor
outbox_mod._kick_relay = lambda: None
runs = []
outbox_mod._HANDLERS[int(OutboxCategory.NOOP)] = lambda p: runs.append(p["k"])

def put(key, k=0):
    with transaction.atomic():
        outbox_put(category=OutboxCategory.NOOP, payload={"k": k}, dedupe_key=key)

put("sq:pending"); put("sq:pending", 1)
row = OutboxMessage.objects.get(dedupe_key="sq:pending")
assert row.rerun is False and row.payload == {"k": 0}
put("sq:claimed")
lease = timezone.now() + timedelta(seconds=60)
OutboxMessage.objects.filter(dedupe_key="sq:claimed").update(claimed_until=lease, attempts=1)
put("sq:claimed", 1)
row = OutboxMessage.objects.get(dedupe_key="sq:claimed")
assert row.rerun is True
_succeed_all([row.id], lease)
row.refresh_from_db()
assert row.processed_at is None and row.claimed_until is None and not row.rerun, row.__dict__
assert row.attempts == 1
with transaction.atomic(), outbox_batch():
    for k in range(3):
        outbox_put(category=OutboxCategory.NOOP, payload={"k": k}, dedupe_key="sq:batch")
assert relay_drain_once() == 3
assert sorted(runs) == [0, 0, 0], runs
assert not OutboxMessage.objects.filter(processed_at__isnull=True).exists()
row.refresh_from_db()
assert row.attempts == 2 and row.processed_at is not None
print("SQLITE RERUN OK")
"""


def test_the_rerun_statements_work_on_sqlite(embedded_sqlite):
    assert "SQLITE RERUN OK" in embedded_sqlite.shell(SQLITE_SCRIPT)


def test_a_handler_that_writes_its_own_key_runs_once_not_forever(monkeypatch):
    # A handler that re-enqueues its own message's key (run the steps again) is absorbed
    # into the message being handled: flagging it would release it after every run.
    seen = []

    def again(payload):
        seen.append(payload["k"])
        _put("self", k=len(seen))

    monkeypatch.setitem(outbox_mod._HANDLERS, int(OutboxCategory.NOOP), again)
    monkeypatch.setattr(outbox_mod, "_kick_relay", lambda: None)
    _put("self")
    from recovery.relay import relay_drain

    assert relay_drain(max_batches=5) == 1
    assert seen == [0]
    assert not OutboxMessage.objects.filter(processed_at__isnull=True).exists()


def test_a_message_released_by_the_mark_is_drained_in_the_same_drain(runs):
    # Released rows are due at once; the drain takes another batch for them instead of
    # returning and leaving them to the beat sweep (no kick follows a release).
    from recovery.relay import relay_drain

    _put("later")
    original = outbox_mod._HANDLERS[int(OutboxCategory.NOOP)]

    def write_during(payload):
        original(payload)
        if len(runs) == 1:  # another request writes the key while this one is handled
            done = threading.Event()

            def other():
                try:
                    _put("later", k=1)
                finally:
                    connection.close()
                    done.set()

            threading.Thread(target=other).start()
            done.wait(10)

    outbox_mod._HANDLERS[int(OutboxCategory.NOOP)] = write_during
    try:
        assert relay_drain(batch=100) == 2  # the first claim, then the released row
    finally:
        outbox_mod._HANDLERS[int(OutboxCategory.NOOP)] = original
    assert runs == [0, 0]
    assert not OutboxMessage.objects.filter(processed_at__isnull=True).exists()
