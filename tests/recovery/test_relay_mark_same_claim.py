"""The relay marks only what this drainer handled (recovery/relay.py `_MARK_SQL` marks by `id =
ANY(ids) AND
claimed_until = <the batch's>`, no `processed_at IS NULL`): two drainers whose batches
carry the *same* claimed_until (a frozen/colliding clock). Drainer A releases a `rerun` row
in a mid-batch flush, drainer B claims it again with an identical claimed_until and is
still handling it when A's final mark (which covers every id again) runs. The invariant:
every write of a key is followed by a run of its message; nothing is left unprocessed."""

import threading
import types
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone as real_tz

import recovery.relay as relay
from recovery.models import OutboxCategory, OutboxMessage
from recovery.outbox import outbox_put

pytestmark = pytest.mark.django_db(transaction=True)


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc
        finally:
            connections.close_all()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _write(key: str, delay: float = 0) -> None:
    with transaction.atomic():
        outbox_put(
            category=OutboxCategory.NOOP, payload={"k": key}, dedupe_key=key, delay_seconds=delay
        )


def test_identical_claimed_until_never_loses_a_rerun(monkeypatch):
    frozen = real_tz.now() + timedelta(seconds=1)
    monkeypatch.setattr(relay, "timezone", types.SimpleNamespace(now=lambda: frozen))
    monkeypatch.setattr("recovery.outbox._kick_relay", lambda *a, **k: None)
    _write("k1")
    _write("k2")
    log: list[tuple[str, str, int]] = []  # (drainer, key, writes of k1 seen so far)
    writes = {"k1": 1}
    b_in, go = threading.Event(), threading.Event()
    b_thread = {}

    def handler(payload):
        key = payload["k"]
        who = threading.current_thread().name
        log.append((who, key, writes["k1"]))
        if who.startswith("B"):
            b_in.set()
            assert go.wait(20)
            return
        if key == "k1" and len(log) == 1:
            t, out = _in_thread(lambda: _write("k1"))  # another process writes k1
            t.join(10)
            assert "error" not in out, out
            writes["k1"] += 1
        if key == "k2":
            _write("k3", delay=3)  # flush: A releases its flagged k1 row (rerun)

            def drain_b():
                threading.current_thread().name = "B-drainer"
                return relay.relay_drain_once(batch=1)

            b_thread["t"], b_thread["out"] = _in_thread(drain_b)
            assert b_in.wait(20), "B never claimed the released row"

    monkeypatch.setattr(relay, "outbox_handler_for", lambda category: handler)
    threading.current_thread().name = "A-drainer"
    try:
        relay.relay_drain_once(batch=2)  # A: its final mark runs while B holds k1
        # k1 written again while B is still handling its claim
        t, out = _in_thread(lambda: _write("k1"))
        t.join(10)
        assert "error" not in out, out
        writes["k1"] += 1
        go.set()
        b_thread["t"].join(20)
        assert "error" not in b_thread["out"], b_thread["out"]
    finally:
        threading.current_thread().name = "MainThread"
        go.set()
    monkeypatch.setattr(relay, "timezone", real_tz)
    frozen2 = real_tz.now() + timedelta(seconds=5)
    monkeypatch.setattr(relay, "timezone", types.SimpleNamespace(now=lambda: frozen2))
    relay.relay_drain(batch=10)

    assert not OutboxMessage.objects.filter(processed_at__isnull=True).exists()
    k1_runs = [seen for who, key, seen in log if key == "k1"]
    print("log", log)
    assert ("B-drainer", "k1", 2) in log, "B did not hold k1 during A's final mark"
    # A's final mark did hit B's row (same claimed_until): the third write found k1
    # processed and wrote a new row, which ran; nothing was lost
    assert OutboxMessage.objects.filter(dedupe_key="k1").count() == 2
    # each write of k1 (3 in all) is followed by a run that began after it
    assert max(k1_runs) == writes["k1"] == 3, log


def test_lease_expiry_reclaim_old_holder_never_marks_the_new_claim(monkeypatch, settings):
    """A's lease runs out while its handler runs; B claims the row again, handles it and is
    still holding it when A's handler returns (A marks its batch) or fails (A's _fail).
    The message must still end processed, never left claimed forever, never lost."""
    settings.OUTBOX_LEASE_SECONDS = 1
    monkeypatch.setattr("recovery.outbox._kick_relay", lambda *a, **k: None)
    _write("L1")
    runs: list[str] = []
    b_in, go = threading.Event(), threading.Event()
    state = {}

    def handler(payload):
        who = threading.current_thread().name
        runs.append(who)
        if who.startswith("B"):
            b_in.set()
            assert go.wait(20)
            return
        if who.startswith("A"):
            import time as _t

            _t.sleep(1.2)  # A's lease is over: B may claim the row

            def drain_b():
                threading.current_thread().name = "B-drainer"
                return relay.relay_drain_once(batch=1)

            state["t"], state["out"] = _in_thread(drain_b)
            assert b_in.wait(20)
            if state.get("fail"):
                raise RuntimeError("A's handler failed late")

    monkeypatch.setattr(relay, "outbox_handler_for", lambda category: handler)
    for fail in (False, True):
        for each in (runs, b_in, go, state):
            each.clear()
        state["fail"] = fail
        if fail:
            _write("L2")
        threading.current_thread().name = "A-drainer"
        try:
            relay.relay_drain_once(batch=1)
        finally:
            threading.current_thread().name = "MainThread"
            go.set()
        state["t"].join(20)
        assert "error" not in state["out"], state["out"]
        key = "L2" if fail else "L1"
        row = OutboxMessage.objects.get(dedupe_key=key)
        # Whether A's late end is a mark or a failure, B's claim stands: B's mark lands.
        # (Before _fail matched the claim, A's late failure cleared B's claim, B's mark
        # missed, and the row ran a redundant third time after A's backoff.)
        assert row.processed_at is not None and row.claimed_until is None
        assert row.last_error == ""
        assert len(runs) == 2, runs  # A and B, nothing more
