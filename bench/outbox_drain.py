"""Bench 3: outbox drain by real Celery workers (1, then 2 processes) vs a raw SQL floor.

20 000 OutboxMessage rows of category NOOP (handler does nothing) are written with one
INSERT … SELECT generate_series, then drained by `celery -A config worker --pool solo`
processes running the real task `recovery.relay_drain` (recovery.relay: one autocommit
SKIP LOCKED claim of 100, handlers outside any transaction, one batched UPDATE marking the
batch processed). Throughput is messages / (last processed_at − the moment the tasks were
sent).
Floor, same PostgreSQL, same table: a raw psycopg loop doing the statements the relay needs
(claim 100 with FOR UPDATE SKIP LOCKED, stamped and returned in one statement, then one
`UPDATE … WHERE id = ANY(…)` marking them processed), in 1 and 2 processes; and, as a
reference row, the floor of issues 18-33 (the claim inside BEGIN/COMMIT, 4 round trips).
Also the relay called in this process without Celery, to split the cost between the
relay's own work and Celery's task machinery.

    .venv/bin/python bench/outbox_drain.py [--messages 20000] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    BIN,
    ROOT,
    Report,
    bench_stack,
    common_args,
    fmt,
    log,
    med,
    ratio,
)

TABLE = "recovery_outboxmessage"
FILL_SQL = f"""
INSERT INTO {TABLE} (category, payload, dedupe_key, available_at, attempts, last_error,
                     created_at)
SELECT 99, jsonb_build_object('n', g), 'bench:' || %s || ':' || g, now(), 0, '', now()
FROM generate_series(1, %s) AS g
"""
# The floor does what the relay needs, in SQL only (same predicate, order and batch): since
# the relay claims in ONE autocommit statement that returns what its handlers
# read (id, category, payload, attempts), oldest first, then marks the batch processed in
# one `UPDATE … WHERE id = ANY(…)`: two round trips per batch, and so does the floor.
CLAIM_SQL = f"""
WITH due AS (
    SELECT id FROM {TABLE}
    WHERE processed_at IS NULL AND available_at <= now()
      AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY available_at, id LIMIT 100
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {TABLE} m SET claimed_until = now() + interval '60 seconds',
                         attempts = m.attempts + 1
    FROM due WHERE m.id = due.id
    RETURNING m.id, m.category, m.payload, m.attempts, m.available_at
)
SELECT id, category, payload, attempts FROM claimed ORDER BY available_at, id
"""
MARK_SQL = (
    f"UPDATE {TABLE} SET processed_at = now(), claimed_until = NULL, last_error = '' "
    "WHERE id = ANY(%s) AND processed_at IS NULL"
)
# The floor of issues 18-33 (kept as a reference row, 1 process): the claim returned ids
# only, inside an explicit transaction (BEGIN, claim, COMMIT, mark: four round trips).
CLAIM_IDS_SQL = f"""
WITH due AS (
    SELECT id FROM {TABLE}
    WHERE processed_at IS NULL AND available_at <= now()
      AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY available_at, id LIMIT 100
    FOR UPDATE SKIP LOCKED
)
UPDATE {TABLE} m SET claimed_until = now() + interval '60 seconds', attempts = m.attempts + 1
FROM due WHERE m.id = due.id
RETURNING m.id
"""


def _start_line(ready, go) -> None:
    # Connected: wait for the others, so the clock starts after every process is spawned
    # and connected (a spawned interpreter takes 0.2-1 s to start, which used to count
    # against the floor: ~10-40 % of a 20 000-message run).
    if ready is not None:
        ready.release()
        go.wait()


def _floor_worker(dsn: str, ready=None, go=None) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        _start_line(ready, go)
        while True:
            ids = [r[0] for r in conn.execute(CLAIM_SQL).fetchall()]
            if not ids:
                return
            conn.execute(MARK_SQL, [ids])


def _floor_worker_v1(dsn: str, ready=None, go=None) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        _start_line(ready, go)
        while True:
            with conn.transaction():
                ids = [r[0] for r in conn.execute(CLAIM_IDS_SQL).fetchall()]
            if not ids:
                return
            conn.execute(MARK_SQL, [ids])


def _fill(n: int, tag: str) -> None:
    from django.db import connection

    with connection.cursor() as c:
        c.execute(f"TRUNCATE {TABLE}")
        c.execute(FILL_SQL, [tag, n])
        c.execute(f"ANALYZE {TABLE}")


def _elapsed_since(t0_db) -> float:
    from django.db import connection

    with connection.cursor() as c:
        c.execute(f"SELECT count(*), max(processed_at) FROM {TABLE} WHERE processed_at IS NOT NULL")
        count, last = c.fetchone()
    return count, (last - t0_db).total_seconds()


def _db_now():
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT clock_timestamp()")
        return c.fetchone()[0]


def _unprocessed() -> int:
    from django.db import connection

    with connection.cursor() as c:
        c.execute(f"SELECT count(*) FROM {TABLE} WHERE processed_at IS NULL")
        return c.fetchone()[0]


def run_floor(dsn: str, n: int, procs: int, tag: str, *, target=_floor_worker) -> float:
    _fill(n, tag)
    # spawn, not fork: this process has threads (Celery's control client, kombu pools) and a
    # forked child can inherit one of their locks held, and hang before it connects.
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    ps = [ctx.Process(target=target, args=(dsn, ready, go)) for _ in range(procs)]
    for p in ps:
        p.start()
    for _ in ps:
        if not ready.acquire(timeout=60):
            raise RuntimeError("floor process did not connect")
    t0 = _db_now()
    go.set()
    for p in ps:
        p.join()
    count, secs = _elapsed_since(t0)
    assert count == n, (count, n)
    return n / secs


def run_in_process(n: int, tag: str) -> tuple[float, float]:
    """(msgs/s, CPU µs per message of this process: steadier than msgs/s under load)."""
    from django.db import connection

    from recovery.relay import relay_drain

    _fill(n, tag)
    connection.close()  # no transaction open, fresh connection like a worker's
    t0 = _db_now()
    cpu = time.process_time()
    while relay_drain():
        pass
    cpu = time.process_time() - cpu
    count, secs = _elapsed_since(t0)
    assert count == n, (count, n)
    return n / secs, cpu * 1e6 / n


def floor_cpu(dsn: str, n: int, tag: str) -> float:
    """The floor's loop in this process: CPU µs per message on the client side."""
    _fill(n, tag)
    cpu = time.process_time()
    _floor_worker(dsn)
    return (time.process_time() - cpu) * 1e6 / n


@contextlib.contextmanager
def celery_workers(env: dict, stack, count: int):
    procs = []
    for i in range(count):
        logf = open(stack.tmp / f"celery-bench-{count}-{i}.log", "ab")
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "celery"),
                    "-A",
                    "config",
                    "worker",
                    "--pool",
                    "solo",
                    "-n",
                    f"bench{count}-{i}@%h",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "-l",
                    "WARNING",
                ],
                env=env,
                cwd=ROOT,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        from config.celery import app

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            replies = app.control.ping(timeout=1.0) or []
            if len(replies) >= count:
                break
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"celery worker exited {p.returncode}")
        else:
            raise RuntimeError("celery workers not ready")
        yield app
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def run_celery(app, n: int, workers: int, tag: str, timeout: float) -> float:
    _fill(n, tag)
    t0 = _db_now()
    # Each relay_drain task drains at most 50 batches of 100; send enough for every
    # worker to stay busy until the table is empty (surplus tasks find nothing).
    tasks = -(-n // 5000) + workers
    for _ in range(tasks):
        app.send_task("recovery.relay_drain")
    deadline = time.monotonic() + timeout
    while _unprocessed() and time.monotonic() < deadline:
        # Keep a task queued while work remains (a drain stops early on a short batch).
        time.sleep(0.25)
    left = _unprocessed()
    if left:
        raise RuntimeError(f"{left} messages left after {timeout}s")
    count, secs = _elapsed_since(t0)
    return n / secs


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    report = Report()
    n = args.messages
    with bench_stack(localstripe=False) as (stack, env):
        dsn = stack.env["DATABASE_URL"].replace("postgres://", "postgresql://")
        res: dict[str, list[float]] = {
            k: []
            for k in (
                "floor1",
                "floor2",
                "inproc",
                "celery1",
                "celery2",
                "floor1v1",
                "cpu_relay",
                "cpu_floor",
            )
        }
        # Each real figure is measured right after its floor (same minute, same load): the
        # machine's speed drifts too much for floors measured minutes apart.
        for workers in (1, 2):
            with celery_workers(env, stack, workers) as app:
                for run in range(args.runs):
                    log(f"run {run + 1}/{args.runs}: floor, {workers} process(es)")
                    res[f"floor{workers}"].append(run_floor(dsn, n, workers, f"f{workers}{run}"))
                    log(f"run {run + 1}/{args.runs}: {workers} celery worker(s)")
                    res[f"celery{workers}"].append(
                        run_celery(app, n, workers, f"c{workers}{run}", args.timeout)
                    )
                    if workers == 1:
                        log(f"run {run + 1}/{args.runs}: relay in-process (no Celery)")
                        rate, cpu = run_in_process(n, f"ip{run}")
                        res["inproc"].append(rate)
                        res["cpu_relay"].append(cpu)
                        res["cpu_floor"].append(floor_cpu(dsn, n, f"fc{run}"))
                        log(f"run {run + 1}/{args.runs}: floor of issues 18-33, 1 process")
                        res["floor1v1"].append(
                            run_floor(dsn, n, 1, f"v1{run}", target=_floor_worker_v1)
                        )
    m = {k: med(v) for k, v in res.items()}
    note = f"{n} NOOP msgs, {args.runs} runs, median"
    report.add(
        "outbox drain",
        "msgs/s 1 celery worker",
        fmt(m["celery1"]),
        fmt(m["floor1"]),
        ratio(m["celery1"], m["floor1"]),
        ">= 0.60",
        f"{note}; floor = raw SQL, 1 proc",
    )
    report.add(
        "outbox drain",
        "msgs/s 2 celery workers",
        fmt(m["celery2"]),
        fmt(m["floor2"]),
        ratio(m["celery2"], m["floor2"]),
        ">= 0.50",
        "floor = raw SQL, 2 procs",
    )
    report.add(
        "outbox drain",
        "2-worker speedup",
        f"{m['celery2'] / m['celery1']:.2f}x",
        f"{m['floor2'] / m['floor1']:.2f}x",
        "",
        ">= 1.7x",
        "floor col = raw SQL 2 vs 1",
    )
    report.add(
        "outbox drain",
        "msgs/s relay in-process",
        fmt(m["inproc"]),
        fmt(m["floor1"]),
        ratio(m["inproc"], m["floor1"]),
        "",
        "recovery.relay.relay_drain, no Celery",
    )
    # Least of the runs: the least disturbed by neighbours on a shared machine.
    report.add(
        "outbox drain",
        "CPU us/msg relay in-process",
        f"{min(res['cpu_relay']):.1f}",
        f"{min(res['cpu_floor']):.1f}",
        "",
        "",
        "client-side CPU per message (process_time), least of runs; floor in-process",
    )
    report.add(
        "outbox drain",
        "msgs/s 1 worker vs old floor",
        fmt(m["celery1"]),
        fmt(m["floor1v1"]),
        ratio(m["celery1"], m["floor1v1"]),
        "",
        "floor of issues 18-33: BEGIN, claim ids, COMMIT, mark (4 round trips)",
    )
    report.dump(args.json)
    report.print("outbox drain")
    return report


if __name__ == "__main__":
    main()
