"""Where a webhook delivery's time goes, per layer, in one process.

The companion of bench/webhook_ingest.py, as bench/profile_reads.py is of the replay
bench: the same Stripe-signed events are posted N times through the full Django stack in
this process (Django's WSGIHandler, as gunicorn calls it: every middleware and the
request_started/finished signals, so CONN_HEALTH_CHECKS' per-request check too; no socket)
— the floor's bare insert,
new events, redeliveries, and the bench's 20 % redelivery mix. For each: wall and CPU ms
per request, PostgreSQL round trips per request, and a cProfile split of the time by
layer (signature verification, JSON parse, normalisation, the INSERT, the relay kick,
logging, prometheus metrics, Django's request + middleware machinery, the rest).

    .venv/bin/python bench/profile_ingest.py [--n 400] [--rounds 5] [--durable] [--top 25]

CPU ms is the least of --rounds interleaved rounds (the least disturbed on a loaded
machine); the layer split comes from one more, profiled round (cProfile inflates every
figure in it, and its wall time includes waiting for PostgreSQL and Redis: read it as
shares). The events are signed before the clock starts (signing is the sender's work).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Report, bench_stack, common_args, log  # noqa: E402
from bench.webhook_ingest import _event, _signed_line  # noqa: E402

# (layer, substrings of a function's file path or builtin's name) — first match wins, by
# own (tottime) time. Builtins have the file "~" and names like "<built-in method ...>".
LAYERS = [
    (
        "signature (stripe, hmac)",
        ("/stripe/", "hmac", "_hashlib", "openssl_sha256", "compare_digest"),
    ),
    ("JSON (parse + dumps)", ("/json/", "_json", "scan_once")),
    ("PostgreSQL + psycopg", ("/psycopg/", "/psycopg_binary/", "psycopg")),
    ("ORM / django.db", ("/django/db/",)),
    (
        "relay kick (redis, celery, kombu)",
        (
            "/redis/",
            "/celery/",
            "/kombu/",
            "/recovery/kick",
            "/recovery/outbox",
            "/config/redis_client",
        ),
    ),
    ("logging", ("/logging/", "log_redaction")),
    ("prometheus metrics", ("/prometheus_client/",)),
    ("Django request + middleware", ("/django/", "/whitenoise/", "/config/")),
    ("Verity (webhooks, normalisation)", ("/webhooks/", "/payments/", "/bench/")),
]
OTHER = "other (stdlib, sockets, selectors)"


def _layers(profile: cProfile.Profile, n: int) -> dict[str, float]:
    stats = pstats.Stats(profile)
    out: dict[str, float] = {name: 0.0 for name, _ in LAYERS}
    out[OTHER] = 0.0
    for (filename, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        where = filename if filename != "~" else func
        for name, marks in LAYERS:
            if any(m in where for m in marks):
                out[name] += tottime
                break
        else:
            out[OTHER] += tottime
    return {k: v * 1000 / n for k, v in out.items()}


def _round_trips(cases, connection) -> dict[str, str]:
    """PostgreSQL statements per request, counted in psycopg itself (Django's
    execute_wrapper sees neither the health check nor a psycopg cursor of our own), and
    Redis round trips (packed sends, a pipeline is one) per request."""
    import psycopg
    from redis.connection import AbstractConnection

    counts = {"pg": 0, "redis": 0}
    pg_execute, redis_send = psycopg.Cursor.execute, AbstractConnection.send_packed_command

    def counted_pg(original):
        def execute(self, *args, **kwargs):
            counts["pg"] += 1
            return original(self, *args, **kwargs)

        return execute

    def counted_redis(self, *args, **kwargs):
        counts["redis"] += 1
        return redis_send(self, *args, **kwargs)

    out = {}
    psycopg.Cursor.execute = counted_pg(pg_execute)
    AbstractConnection.send_packed_command = counted_redis
    try:
        for name, send in cases:
            counts.update(pg=0, redis=0)
            for _ in range(40):
                send()
            out[name] = f"PG statements {counts['pg'] / 40:.2f}, Redis {counts['redis'] / 40:.2f}"
    finally:
        psycopg.Cursor.execute = pg_execute  # Django's cursors are ClientCursor subclasses
        AbstractConnection.send_packed_command = redis_send
    _ = connection
    return out


def _timed(send, n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        send()
    return (time.perf_counter() - wall) * 1000 / n, (time.process_time() - cpu) * 1000 / n


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--n", type=int, default=400, help="requests per round and case")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="timed rounds per case, interleaved; the least is kept",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=0,
        help="print each case's N costliest functions (own time) on stderr",
    )
    parser.add_argument("--only", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    report = Report()
    with bench_stack(localstripe=False) as (_stack, _env):
        from django.core.handlers.wsgi import WSGIHandler
        from django.db import connection

        from bench.floor_views import FLOOR_TABLE_SQL
        from recovery.models import OutboxMessage
        from webhooks.models import ProviderEvent

        with connection.cursor() as c:
            c.execute(FLOOR_TABLE_SQL)
        handler = WSGIHandler()

        def post(path: str, sig: str, body: str, cookie: str = "") -> int:
            data = body.encode()
            status = []
            environ = {
                "REQUEST_METHOD": "POST",
                "PATH_INFO": path,
                "SCRIPT_NAME": "",
                "QUERY_STRING": "",
                "SERVER_NAME": "127.0.0.1",
                "SERVER_PORT": "8000",
                "SERVER_PROTOCOL": "HTTP/1.1",
                "REMOTE_ADDR": "127.0.0.1",
                "CONTENT_TYPE": "application/json",
                "CONTENT_LENGTH": str(len(data)),
                "HTTP_HOST": "127.0.0.1",
                "HTTP_STRIPE_SIGNATURE": sig,
                "wsgi.input": io.BytesIO(data),
                "wsgi.url_scheme": "http",
                "wsgi.errors": sys.stderr,
                "wsgi.version": (1, 0),
                "wsgi.multithread": False,
                "wsgi.multiprocess": True,
                "wsgi.run_once": False,
            }
            if cookie:  # any cookie: the whole middleware chain (config.early_webhook)
                environ["HTTP_COOKIE"] = cookie
            response = handler(environ, lambda s, h, *a: status.append(s))
            try:
                b"".join(response)
            finally:
                response.close()  # request_finished, as gunicorn does
            return int(status[0].split()[0])

        seq = iter(range(10**9))
        # Each pass needs its own events (a "new" event is new once); signed up front.
        total = (args.rounds + 2) * args.n + 50

        def new_lines(prefix: str) -> list[tuple[str, str]]:
            out = []
            for i in range(total):
                sig, body = _signed_line(
                    json.dumps(_event(f"evt_{prefix}_{i:07d}"), separators=(",", ":"))
                ).split("\t", 1)
                out.append((sig, body))
            return out

        log(f"signing {total} events per case")
        floor_lines, new_events = new_lines("floor"), new_lines("new")
        chain_events = new_lines("chain")
        mixed_lines = new_lines("mixed")
        # Duplicates: events stored by a warm-up below, re-sent.
        dup_pool = new_lines("dup")[:200]

        def poster(path: str, lines, cookie: str = ""):
            it = iter(lines)

            def send():
                sig, body = next(it)
                assert post(path, sig, body, cookie) == 200

            return send

        for sig, body in dup_pool:  # stored once: from now on each is a redelivery
            assert post("/webhooks/stripe/", sig, body) == 200

        def dup_stream():
            while True:
                yield dup_pool[next(seq) % len(dup_pool)]

        def mixed_stream():
            sent: list[tuple[str, str]] = []
            fresh = iter(mixed_lines)
            while True:
                if len(sent) > 64 and random.random() < 0.2:
                    yield sent[random.randrange(0, len(sent) - 63)]
                else:
                    line = next(fresh)
                    sent.append(line)
                    yield line

        cases = [
            ("floor (bare insert)", poster("/bench-floor/insert", floor_lines)),
            ("webhook, new event", poster("/webhooks/stripe/", new_events)),
            # The same through every middleware (a cookie declines the early answer): the
            # early answer's gain, measured in the same run.
            (
                "webhook, new event, whole chain",
                poster("/webhooks/stripe/", chain_events, cookie="bench=1"),
            ),
            ("webhook, redelivery", poster("/webhooks/stripe/", dup_stream())),
            ("webhook, 20 % redeliveries", poster("/webhooks/stripe/", mixed_stream())),
        ]
        cases = [c for c in cases if not args.only or args.only in c[0] or c[0].startswith("floor")]
        for _name, send in cases:  # warm: caches, prepared statements, the relay kick key
            for _ in range(20):
                send()
        statements = _round_trips(cases, connection)
        rounds: dict[str, list] = {name: [] for name, _ in cases}
        for i in range(args.rounds):  # interleaved: a load spike hits every case alike
            log(f"round {i + 1}/{args.rounds}: {len(cases)} cases x {args.n} requests")
            for name, send in cases:
                rounds[name].append(_timed(send, args.n))
        results = {}
        for name, send in cases:
            log(f"{name}: profiled, {args.n} requests")
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.n):
                send()
            prof.disable()
            if args.top:
                print(f"\n===== {name}", file=sys.stderr)
                pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.top)
            wall = min(w for w, _ in rounds[name])
            cpu = min(c for _, c in rounds[name])
            results[name] = (wall, cpu, _layers(prof, args.n))
        events, outbox = ProviderEvent.objects.count(), OutboxMessage.objects.count()
    floor_cpu = results["floor (bare insert)"][1]
    for name, (wall, cpu, layers) in results.items():
        split = ", ".join(f"{k} {v:.3f}" for k, v in layers.items() if v >= 0.0005)
        report.add(
            "ingest profile",
            name,
            f"{cpu:.3f} ms CPU",
            f"{floor_cpu:.3f}",
            f"{floor_cpu / cpu:.2f}" if cpu else "n/a",
            "",
            f"wall {wall:.3f} ms; {statements.get(name, '')}; profiled ms: {split}",
        )
    report.add("ingest profile", "check", f"{events} events, {outbox} outbox rows")
    report.dump(args.json)
    report.print("ingest profile (per request, in one process; ratio = floor CPU / CPU)")
    return report


if __name__ == "__main__":
    main()
