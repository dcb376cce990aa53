"""Bench 6: hot paths with a year of history present vs on empty tables, in one run.

Two databases in ONE PostgreSQL cluster (same server, same buffers, same load):
- `verity`: the tables empty (emptied again before every round);
- `verity_full`: the same schema plus 5 M processed outbox rows and 5 M stored provider
  events (applied), filled with set-based SQL (INSERT … SELECT generate_series, the
  secondary indexes dropped during the fill and rebuilt after, then VACUUM ANALYZE: the
  state autovacuum leaves a table in), keys shaped like production's (random object,
  operation and purchase ids; event ids with a time prefix, like Stripe's).
Each round measures, on both databases, alternating which goes first (empty/full, then
full/empty) so load drift on this shared machine cancels:
- webhook ingest: the real endpoint under gunicorn (4 sync workers, wrk 16 connections,
  20 % redeliveries: bench/webhook_ingest.py's requests and Lua script);
- outbox drain: 20 000 NOOP messages drained by one real Celery worker (recovery.relay,
  SKIP LOCKED claims of 100: bench/outbox_drain.py's method), messages/s.
Then the retention job prunes part of the full database's history (rows/s, per batch) and
one more alternating round measures the full side right after it (dead tuples present,
before any vacuum: the state a prune leaves the tables in); then VACUUM (what autovacuum
does after a prune) and one more round. Each index's size is printed after the fill,
after the prune, after the VACUUM and after the last round: pages freed by a prune are
reused by new rows, so the indexes stop growing once retention runs (the figure that
argues retention alone holds, docs/retention.md).
Also: the /metrics collection on each database (the DatabaseCollector's queries, median of
3): its seconds, its statement count, which must not grow with the history, and its
slowest statement.

Headline: full / empty for each figure (goal: within 10 %, i.e. >= 0.90).

    .venv/bin/python bench/history.py [--rows 5000000] [--rounds 3] [--seconds 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    BIN,
    PY,
    ROOT,
    Report,
    bench_stack,
    common_args,
    fmt,
    gunicorn,
    log,
    machine,
    med,
    require_wrk,
    wrk,
)
from bench.webhook_ingest import DUPLICATE_SHARE, LUA, write_requests  # noqa: E402

OUTBOX = "recovery_outboxmessage"
EVENTS = "webhooks_providerevent"
SIDES = ("empty", "full")

FILL_OUTBOX = f"""
INSERT INTO {OUTBOX} (category, payload, dedupe_key, available_at, claimed_until, attempts,
                      last_error, processed_at, created_at)
SELECT 1, jsonb_build_object('event', g), 'event:hist' || g, t, NULL, 1, '',
       t + interval '2 seconds', t
FROM (SELECT g, now() - interval '30 days' + g * (interval '30 days' / %(n)s) AS t
      FROM generate_series(1, %(n)s) AS g) s
"""
# 180 days of events, applied, with the stored (safe) payload's shape and size. Two md5s
# per row give the random-looking object, operation and purchase ids.
FILL_EVENTS = f"""
INSERT INTO {EVENTS} (event_id, type, account, object_id, created, received_at, payload,
                      result, result_reason, operation_id, purchase_id, attempts,
                      processed_at)
SELECT 'evt_1' || lpad(to_hex(g), 8, '0') || substr(h1, 1, 15),
       'payment_intent.succeeded', '', 'pi_' || substr(h1, 9, 24), t, t,
       jsonb_build_object(
         'id', 'evt_1' || lpad(to_hex(g), 8, '0'), 'type', 'payment_intent.succeeded',
         'created', extract(epoch FROM t)::bigint,
         'object', jsonb_build_object(
            'id', 'pi_' || substr(h1, 9, 24), 'object', 'payment_intent',
            'amount', 1500, 'amount_received', 1500, 'currency', 'usd', 'status', 'succeeded',
            'capture_method', 'automatic', 'latest_charge', 'ch_' || substr(h2, 9, 24),
            'metadata', jsonb_build_object('operation_id', 'op_' || substr(h2, 1, 24),
                                           'purchase_id', 'pur_' || substr(h1, 1, 24)))),
       'applied', '', 'op_' || substr(h2, 1, 24), 'pur_' || substr(h1, 1, 24), 1,
       t + interval '1 second'
FROM (SELECT g, md5(g::text) AS h1, md5((-g)::text) AS h2,
             now() - interval '180 days' + g * (interval '180 days' / %(n)s) AS t
      FROM generate_series(1, %(n)s) AS g) s
"""
DRAIN_FILL = f"""
INSERT INTO {OUTBOX} (category, payload, dedupe_key, available_at, attempts, last_error,
                      created_at)
SELECT 99, jsonb_build_object('n', g), 'bench:' || %s || ':' || g, now(), 0, '', now()
FROM generate_series(1, %s) AS g
"""


def _dsn(url: str, db: str) -> str:
    return url.replace("postgres://", "postgresql://").rsplit("/", 1)[0] + "/" + db


def _exec(dsn: str, *statements, params=None, fetch=False):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        out = None
        for sql in statements:
            cur = conn.execute(sql, params)
            if fetch:
                out = cur.fetchall()
        return out


def _secondary_indexes(dsn: str, table: str) -> tuple[list[str], list[str]]:
    """(drop statements, create statements) for every index but the primary key."""
    rows = _exec(
        dsn,
        f"""
        SELECT i.relname, pg_get_indexdef(i.oid), c.conname, pg_get_constraintdef(c.oid)
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid
        WHERE x.indrelid = '{table}'::regclass AND NOT x.indisprimary""",
        fetch=True,
    )
    drops, creates = [], []
    for name, indexdef, conname, condef in rows:
        if conname:
            drops.append(f"ALTER TABLE {table} DROP CONSTRAINT {conname}")
            creates.append(f"ALTER TABLE {table} ADD CONSTRAINT {conname} {condef}")
        else:
            drops.append(f"DROP INDEX {name}")
            creates.append(indexdef)
    return drops, creates


def fill_history(dsn: str, rows: int) -> dict:
    figures = {}
    for table, sql in ((OUTBOX, FILL_OUTBOX), (EVENTS, FILL_EVENTS)):
        t = time.monotonic()
        drops, creates = _secondary_indexes(dsn, table)
        _exec(dsn, *drops)
        _exec(dsn, sql, params={"n": rows})
        t_insert = time.monotonic() - t
        _exec(dsn, "SET maintenance_work_mem = '512MB'", *creates)
        t_index = time.monotonic() - t - t_insert
        _exec(dsn, f"VACUUM (ANALYZE) {table}")
        figures[table] = time.monotonic() - t
        log(
            f"  {table}: insert {t_insert:.0f}s, {len(creates)} indexes {t_index:.0f}s, "
            f"vacuum {figures[table] - t_insert - t_index:.0f}s"
        )
        size = _exec(dsn, f"SELECT pg_size_pretty(pg_total_relation_size('{table}'))", fetch=True)[
            0
        ][0]
        figures[f"{table}_size"] = size
        log(f"filled {table}: {rows:,} rows, {size} with indexes, {figures[table]:.0f}s")
    return figures


def index_sizes(dsn: str) -> dict[str, int]:
    """Bytes of each of the two history tables (`<table>`: its heap) and of each of their
    indexes (`<table>.<index>`)."""
    rows = _exec(
        dsn,
        f"""
        SELECT t.relname || coalesce('.' || i.relname, ''),
               pg_relation_size(coalesce(i.oid, t.oid))
        FROM pg_class t LEFT JOIN pg_index x ON x.indrelid = t.oid
        LEFT JOIN pg_class i ON i.oid = x.indexrelid
        WHERE t.relname IN ('{OUTBOX}', '{EVENTS}')
        UNION ALL SELECT relname, pg_relation_size(oid) FROM pg_class
        WHERE relname IN ('{OUTBOX}', '{EVENTS}') ORDER BY 1""",
        fetch=True,
    )
    return dict(rows)


def _count_rows(dsn: str) -> dict:
    return {t: _exec(dsn, f"SELECT count(*) FROM {t}", fetch=True)[0][0] for t in (OUTBOX, EVENTS)}


# -- one measurement each ---------------------------------------------------------------


def measure_ingest(base: str, stack, seconds: float, tag: str):
    path = stack.tmp / f"hist-{tag}.txt"
    write_requests(path, n=40000, prefix=tag, duplicates=DUPLICATE_SHARE)
    return wrk(
        f"{base}/webhooks/stripe/",
        LUA,
        seconds=seconds,
        connections=16,
        env={"BENCH_REQUESTS": str(path)},
    )


def settle_ingest_rows(dsn: str) -> None:
    """The ingest's outbox rows would be claimed by the next drain (PROCESS_EVENT, with
    provider read-backs): mark them processed so the drain measures its NOOP batch only.
    First wait until the web has finished: on a loaded machine gunicorn still answers
    requests wrk sent (they sat in its backlog) seconds after wrk has stopped."""
    last, still = None, 0
    while still < 4:
        now = _exec(dsn, f"SELECT coalesce(max(id), 0) FROM {EVENTS}", fetch=True)[0][0]
        still = still + 1 if now == last else 0
        last = now
        time.sleep(0.5)
    _exec(dsn, f"UPDATE {OUTBOX} SET processed_at = now() WHERE processed_at IS NULL")


def measure_drain(app, dsn: str, n: int, tag: str, timeout: float = 300) -> float:
    below = _exec(dsn, f"SELECT coalesce(max(id), 0) FROM {OUTBOX}", fetch=True)[0][0]
    _exec(dsn, DRAIN_FILL, params=[tag, n])
    t0 = _exec(dsn, "SELECT clock_timestamp()", fetch=True)[0][0]
    for _ in range(-(-n // 5000) + 1):
        app.send_task("recovery.relay_drain")
    deadline = time.monotonic() + timeout
    left_sql = (
        f"SELECT count(*) FROM {OUTBOX} WHERE processed_at IS NULL AND id > {below} "
        "AND category = 99"
    )
    while time.monotonic() < deadline:
        left = _exec(dsn, left_sql, fetch=True)[0][0]
        if not left:
            break
        time.sleep(0.25)
    else:
        raise RuntimeError(f"{left} messages left after {timeout}s")
    count, last = _exec(
        dsn,
        f"SELECT count(*), max(processed_at) FROM {OUTBOX} WHERE id > {below} AND category = 99",
        fetch=True,
    )[0]
    assert count == n, (count, n)
    return n / (last - t0).total_seconds()


@contextlib.contextmanager
def celery_worker(env: dict, stack, app, name: str):
    """One solo-pool worker on this side's database and broker (bench/outbox_drain.py's
    workers, pinged through this side's broker)."""
    import signal

    logf = open(stack.tmp / f"celery-history-{name}.log", "ab")
    proc = subprocess.Popen(
        [
            str(BIN / "celery"),
            "-A",
            "config",
            "worker",
            "--pool",
            "solo",
            "-n",
            f"history-{name}@%h",
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
    try:
        deadline = time.monotonic() + 240
        while not app.control.ping(timeout=1.0):
            if proc.poll() is not None or time.monotonic() > deadline:
                logf.flush()
                tail = (stack.tmp / f"celery-history-{name}.log").read_text()[-2000:]
                raise RuntimeError(f"celery worker {name} not ready: {tail}")
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_prune(env: dict, *, table: str, max_batches: int) -> dict:
    out = subprocess.run(
        [
            PY,
            "manage.py",
            "retention_prune",
            "--table",
            table,
            "--json",
            "--max-batches",
            str(max_batches),
        ],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def collect_metrics(env: dict, *, times: int = 3) -> tuple[float, int, str]:
    """(seconds, SQL statements, the slowest statement) of a DatabaseCollector collection:
    the median of `times` collections after a first one (one sample on a shared machine
    says more about the machine than about the tables)."""
    code = (
        "import json, statistics, time; from django.db import connection as k; "
        "from django.test.utils import CaptureQueriesContext as Q; "
        "from recovery.metrics import DatabaseCollector as C; c = C(); "
        "list(c._collect()); runs = []\n"
        f"for _ in range({times}):\n"
        "    t = time.perf_counter(); q = Q(k); q.__enter__(); list(c._collect()); "
        "s = time.perf_counter() - t; q.__exit__(None, None, None); "
        "slow = max(q.captured_queries, key=lambda x: float(x['time'])); "
        "runs.append((s, len(q.captured_queries), f\"{float(slow['time']):.3f} s: "
        "{slow['sql'][:90]}\"))\n"
        "runs.sort(); print(json.dumps(runs[len(runs) // 2]))"
    )
    out = subprocess.run(
        [PY, "manage.py", "shell", "-c", code],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    seconds, statements, slowest = json.loads(out.stdout.strip().splitlines()[-1])
    return float(seconds), int(statements), slowest


def _of(relation: str, table: str) -> bool:
    """Is `relation` (a name from index_sizes) the table's heap or one of its indexes?"""
    return relation == table or relation.startswith(table + ".")


# -- the run ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument(
        "--rows",
        type=int,
        default=5_000_000,
        help="processed outbox rows and stored events in the full database",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="alternating rounds before the prune (default --runs)",
    )
    parser.add_argument("--seconds", type=float, default=8, help="wrk seconds per ingest")
    parser.add_argument("--messages", type=int, default=20000, help="outbox drain batch")
    parser.add_argument(
        "--prune-batches",
        type=int,
        default=300,
        help="retention pages (of RETENTION_BATCH_SIZE) pruned per table",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or args.runs
    require_wrk()
    report = Report()
    load_start = os.getloadavg()
    with bench_stack(localstripe=False) as (stack, env):
        base_url = stack.env["DATABASE_URL"]
        admin = _dsn(base_url, "postgres")
        from django.db import connections

        connections.close_all()
        _exec(admin, "CREATE DATABASE verity_full TEMPLATE verity")
        dsn = {"empty": _dsn(base_url, "verity"), "full": _dsn(base_url, "verity_full")}
        redis = stack.env["REDIS_URL"].rsplit("/", 1)[0]
        # Each side its own database and its own broker database: the web's on-commit kicks
        # go to a queue no worker reads (as in bench/webhook_ingest.py: nothing processed
        # while ingest is measured); the drain's tasks go to that side's worker only.
        side_env = {
            side: {
                **env,
                "DATABASE_URL": dsn[side].replace("postgresql://", "postgres://"),
                "CELERY_BROKER_URL": f"{redis}/{2 + i}",
                "REDIS_URL": f"{redis}/{4 + i}",
                "METRICS_CACHE_SECONDS": "0",
            }
            for i, side in enumerate(SIDES)
        }
        web_env = {
            side: {**e, "CELERY_BROKER_URL": f"{redis}/{6 + i}"}
            for i, (side, e) in enumerate(side_env.items())
        }
        log(
            f"filling verity_full with {args.rows:,} processed outbox rows and "
            f"{args.rows:,} stored events (set-based SQL)"
        )
        fill = fill_history(dsn["full"], args.rows)

        sizes = {"filled": index_sizes(dsn["full"])}
        res: dict[str, dict[str, list]] = {
            s: {
                f"{kind}{suffix}": []
                for kind in ("ingest", "drain")
                for suffix in ("", "_after", "_vacuumed")
            }
            for s in SIDES
        }
        prune: dict[str, dict] = {}
        with contextlib.ExitStack() as stack_ctx:
            from celery import Celery

            bases = {
                s: stack_ctx.enter_context(gunicorn(web_env[s], stack, workers=4)) for s in SIDES
            }
            apps = {}
            # Celery reads CELERY_BROKER_URL from the environment before its `broker`
            # argument: without this, both apps would ping and send to the stack's broker.
            os.environ.pop("CELERY_BROKER_URL", None)
            for s in SIDES:
                apps[s] = Celery(f"bench-{s}", broker=side_env[s]["CELERY_BROKER_URL"])
                stack_ctx.enter_context(celery_worker(side_env[s], stack, apps[s], s))

            def one_round(r: int, suffix: str) -> None:
                order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
                _exec(dsn["empty"], f"TRUNCATE {OUTBOX}, {EVENTS}")
                for side in order:
                    tag = f"{side[0]}{r}{suffix}{secrets.token_hex(2)}"
                    log(f"round {r + 1}{suffix}: webhook ingest, {side}")
                    res[side]["ingest" + suffix].append(
                        measure_ingest(bases[side], stack, args.seconds, tag)
                    )
                    settle_ingest_rows(dsn[side])
                for side in order:
                    log(f"round {r + 1}{suffix}: outbox drain, {side}")
                    res[side]["drain" + suffix].append(
                        measure_drain(apps[side], dsn[side], args.messages, f"d{r}{suffix}")
                    )

            for r in range(rounds):
                one_round(r, "")
            # Retention on the full side: outbox rows older than 7 days, events older than
            # 90 (the defaults) are due; prune a bounded part of them and time it.
            for table in (OUTBOX, EVENTS):
                log(f"retention: pruning {table} ({args.prune_batches} pages) on the full side")
                t = time.monotonic()
                prune[table] = run_prune(
                    side_env["full"], table=table, max_batches=args.prune_batches
                )
                prune[table]["wall"] = time.monotonic() - t
            sizes["pruned"] = index_sizes(dsn["full"])
            one_round(rounds, "_after")
            one_round(rounds + 1, "_after")
            # What autovacuum does after a prune: dead index entries and heap tuples become
            # free space that the next inserts reuse.
            _exec(dsn["full"], f"VACUUM (ANALYZE) {OUTBOX}", f"VACUUM (ANALYZE) {EVENTS}")
            sizes["vacuumed"] = index_sizes(dsn["full"])
            one_round(rounds + 2, "_vacuumed")
            sizes["after_ingest"] = index_sizes(dsn["full"])
        scrape = {s: collect_metrics(side_env[s]) for s in SIDES}
        rows_end = {s: _count_rows(dsn[s]) for s in SIDES}

    def m(side, kind, attr):
        return med([getattr(x, attr) for x in res[side][kind]])

    load_end = os.getloadavg()
    note = f"{rounds} alternating rounds, median; load avg {load_start[0]:.1f} -> {load_end[0]:.1f}"
    for suffix, label in (
        ("", ""),
        ("_after", " after prune"),
        ("_vacuumed", " after prune + VACUUM"),
    ):
        e_rps, f_rps = m("empty", "ingest" + suffix, "rps"), m("full", "ingest" + suffix, "rps")
        report.add(
            "history",
            f"webhook ingest req/s{label}",
            fmt(f_rps),
            fmt(e_rps),
            f"{f_rps / e_rps:.2f}",
            ">= 0.90",
            f"full p50/p99 {m('full', 'ingest' + suffix, 'p50_ms'):.1f}/"
            f"{m('full', 'ingest' + suffix, 'p99_ms'):.1f} ms, empty "
            f"{m('empty', 'ingest' + suffix, 'p50_ms'):.1f}/"
            f"{m('empty', 'ingest' + suffix, 'p99_ms'):.1f} ms; floor col = empty",
        )
        e_d, f_d = med(res["empty"]["drain" + suffix]), med(res["full"]["drain" + suffix])
        report.add(
            "history",
            f"outbox drain msgs/s{label}",
            fmt(f_d),
            fmt(e_d),
            f"{f_d / e_d:.2f}",
            ">= 0.90",
            f"1 celery worker, {args.messages} NOOP msgs; floor col = empty",
        )
    for table, p in prune.items():
        report.add(
            "history",
            f"retention prune {table}",
            f"{p['pruned'] / p['seconds']:,.0f} rows/s",
            "",
            "",
            "",
            f"{p['pruned']:,} rows in {p['batches']} batches, {p['seconds']:.1f}s "
            f"({p['seconds'] / max(1, p['batches']) * 1000:.0f} ms/batch); "
            f"{p['due']:,} still due",
        )
    report.add(
        "history",
        "metrics collection s",
        f"{scrape['full'][0]:.3f}",
        f"{scrape['empty'][0]:.3f}",
        f"{scrape['empty'][0] / scrape['full'][0]:.2f}",
        ">= 0.90",
        f"DatabaseCollector, median of 3 scrapes, no cache; statements "
        f"full {scrape['full'][1]} vs empty {scrape['empty'][1]}; floor col = empty; "
        f"slowest statement, full: {scrape['full'][2]}",
    )
    for table in (OUTBOX, EVENTS):
        report.add(
            "history",
            f"{table} heap + indexes MB (fill/prune/vacuum/ingest)",
            "/".join(
                f"{sum(v for k, v in sz.items() if _of(k, table)) / 2**20:,.0f}"
                for sz in sizes.values()
            ),
            "",
            "",
            "",
            "full side; pruned pages are reused, not returned",
        )
    report.add(
        "history",
        "check",
        f"full: {rows_end['full'][OUTBOX]:,} outbox, {rows_end['full'][EVENTS]:,} events",
        "",
        "",
        "",
        f"fill {fill[OUTBOX]:.0f}s + {fill[EVENTS]:.0f}s "
        f"({fill[OUTBOX + '_size']}, {fill[EVENTS + '_size']}); {note}",
    )
    print("index sizes on the full side, MB (after fill / prune / VACUUM / one more round):")
    for name in sizes["filled"]:
        print(
            f"  {name:48s} "
            + " / ".join(f"{sz.get(name, 0) / 2**20:9.1f}" for sz in sizes.values())
        )
    raw = {s: {k: [getattr(x, "rps", x) for x in v] for k, v in res[s].items()} for s in SIDES}
    print(f"per-round figures (req/s or msgs/s): {json.dumps(raw)}")
    mach = machine()
    print(
        f"machine: {mach['nproc']} cores, load average at start {load_start}, at end "
        f"{load_end}: a shared machine, busy with other work during this run"
    )
    report.dump(args.json)
    report.print(
        f"history: full ({args.rows:,} rows per table) vs empty tables, same cluster, same run"
    )
    return report


if __name__ == "__main__":
    main()
