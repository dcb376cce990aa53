"""Bench 1: webhook ingest under gunicorn, 16 connections, against PostgreSQL.

Real path: POST /webhooks/stripe/ with Stripe-signed events (HMAC-SHA256 over
"<ts>.<body>"), 20 % of them redeliveries of an event already sent; the view verifies,
inserts the event (ON CONFLICT DO NOTHING) and its outbox row in one prepared statement and
kicks the relay (coalesced: a few Redis round trips per window per worker, not one per
event; no worker runs, so nothing is processed during the measurement).
Floor, same gunicorn, same run: a bare view that parses the body and inserts one row.
Also: all-new vs all-duplicate passes over the real endpoint (duplicates must be no slower).

    .venv/bin/python bench/webhook_ingest.py [--seconds 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import random
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    WEBHOOK_SECRET,
    Report,
    bench_stack,
    common_args,
    fmt,
    gunicorn,
    log,
    med,
    ratio,
    require_wrk,
    wrk,
)

LUA = Path(__file__).resolve().parent / "lua" / "signed_posts.lua"
DUPLICATE_SHARE = 0.2


def _event(event_id: str) -> dict:
    op, pur = f"op_{secrets.token_hex(12)}", f"pur_{secrets.token_hex(12)}"
    return {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": int(time.time()),
        "livemode": False,
        "pending_webhooks": 1,
        "type": "payment_intent.succeeded",
        "data": {
            "object": {
                "id": f"pi_{secrets.token_hex(12)}",
                "object": "payment_intent",
                "amount": 1500,
                "amount_received": 1500,
                "currency": "usd",
                "capture_method": "automatic",
                "status": "succeeded",
                "latest_charge": f"ch_{secrets.token_hex(12)}",
                "metadata": {
                    "operation_id": op,
                    "purchase_id": pur,
                    "customer_reference": f"cust-{secrets.token_hex(4)}",
                },
                "payment_method": "pm_card_visa",
                "livemode": False,
            }
        },
    }


def _signed_line(body: str) -> str:
    ts = int(time.time())
    mac = hmac.new(WEBHOOK_SECRET.encode(), f"{ts}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}\t{body}"


def write_requests(path: Path, *, n: int, prefix: str, duplicates: float) -> list[str]:
    """n lines; a duplicate repeats an event at least 64 lines earlier (so the original
    has been sent before, even with 16 requests in flight). Returns the lines."""
    lines: list[str] = []
    for i in range(n):
        if duplicates and i >= 64 and random.random() < duplicates:
            lines.append(lines[random.randrange(0, i - 63)])
        else:
            lines.append(
                _signed_line(json.dumps(_event(f"evt_{prefix}_{i:07d}"), separators=(",", ":")))
            )
    path.write_text("\n".join(lines) + "\n")
    return lines


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument(
        "--lines",
        type=int,
        default=40000,
        help="pre-signed requests per file (more than one pass sends)",
    )
    args = parser.parse_args(argv)
    require_wrk()
    report = Report()
    with bench_stack(localstripe=False) as (stack, env):
        from django.db import connection

        from bench.floor_views import FLOOR_TABLE_SQL
        from recovery.models import OutboxMessage
        from webhooks.models import ProviderEvent

        with connection.cursor() as c:
            c.execute(FLOOR_TABLE_SQL)
        results: dict[str, list] = {"floor": [], "mixed": [], "chain": [], "new": [], "dup": []}
        wrapped = []
        with gunicorn(env, stack, workers=args.workers) as base:
            for run in range(args.runs):
                tag = f"r{run}{secrets.token_hex(2)}"
                files = {}
                for kind, dup in (
                    ("floor", DUPLICATE_SHARE),
                    ("mixed", DUPLICATE_SHARE),
                    ("chain", DUPLICATE_SHARE),
                    ("new", 0.0),
                ):
                    files[kind] = stack.tmp / f"wh-{tag}-{kind}.txt"
                    write_requests(files[kind], n=args.lines, prefix=f"{tag}{kind}", duplicates=dup)
                log(f"run {run + 1}/{args.runs}: floor")
                results["floor"].append(
                    wrk(
                        f"{base}/bench-floor/insert",
                        LUA,
                        seconds=args.seconds,
                        connections=args.connections,
                        env={"BENCH_REQUESTS": str(files["floor"])},
                    )
                )
                log(f"run {run + 1}/{args.runs}: webhook, {DUPLICATE_SHARE:.0%} duplicates")
                r = wrk(
                    f"{base}/webhooks/stripe/",
                    LUA,
                    seconds=args.seconds,
                    connections=args.connections,
                    env={"BENCH_REQUESTS": str(files["mixed"])},
                )
                results["mixed"].append(r)
                wrapped.append(r.requests > args.lines)
                # The same mix through every middleware (a cookie declines the early answer,
                # config.early_webhook): that answer's gain, in the same run and stack.
                log(
                    f"run {run + 1}/{args.runs}: webhook, {DUPLICATE_SHARE:.0%} duplicates, "
                    "whole middleware chain"
                )
                r = wrk(
                    f"{base}/webhooks/stripe/",
                    LUA,
                    seconds=args.seconds,
                    connections=args.connections,
                    env={"BENCH_REQUESTS": str(files["chain"]), "BENCH_COOKIE": "bench=1"},
                )
                results["chain"].append(r)
                wrapped.append(r.requests > args.lines)
                log(f"run {run + 1}/{args.runs}: webhook, all new")
                r = wrk(
                    f"{base}/webhooks/stripe/",
                    LUA,
                    seconds=args.seconds,
                    connections=args.connections,
                    env={"BENCH_REQUESTS": str(files["new"])},
                )
                results["new"].append(r)
                wrapped.append(r.requests > args.lines)
                # All-duplicate pass: only the events the all-new pass really stored.
                stored = ProviderEvent.objects.filter(event_id__startswith=f"evt_{tag}new_").count()
                lines = files["new"].read_text().splitlines()[:stored]
                files["dup"] = stack.tmp / f"wh-{tag}-dup.txt"
                # Re-sign: the stored bodies, fresh timestamps (a redelivery is signed anew).
                files["dup"].write_text(
                    "\n".join(_signed_line(ln.split("\t", 1)[1]) for ln in lines) + "\n"
                )
                log(f"run {run + 1}/{args.runs}: webhook, all duplicates ({stored} events)")
                results["dup"].append(
                    wrk(
                        f"{base}/webhooks/stripe/",
                        LUA,
                        seconds=args.seconds,
                        connections=args.connections,
                        env={"BENCH_REQUESTS": str(files["dup"])},
                    )
                )
        events = ProviderEvent.objects.count()
        outbox = OutboxMessage.objects.count()

    def m(kind, attr):
        return med([getattr(r, attr) for r in results[kind]])

    errors = sum(r.non2xx + r.errors for rs in results.values() for r in rs)
    floor_rps = m("floor", "rps")
    note = (
        f"{args.connections} conns, {args.workers} gunicorn workers, "
        f"{args.runs}x{args.seconds:.0f}s"
    )
    report.add(
        "webhook ingest",
        "req/s (20% dup)",
        fmt(m("mixed", "rps")),
        fmt(floor_rps),
        ratio(m("mixed", "rps"), floor_rps),
        ">= 0.70",
        note,
    )
    report.add(
        "webhook ingest",
        "p50 / p99 ms (20% dup)",
        f"{m('mixed', 'p50_ms'):.1f} / {m('mixed', 'p99_ms'):.1f}",
        f"{m('floor', 'p50_ms'):.1f} / {m('floor', 'p99_ms'):.1f}",
        "",
        "",
        "floor = bare view, one INSERT",
    )
    report.add(
        "webhook ingest",
        "req/s (20% dup), whole chain",
        fmt(m("chain", "rps")),
        fmt(floor_rps),
        ratio(m("chain", "rps"), floor_rps),
        "",
        f"a cookie on each delivery: every middleware, as before the early answer; "
        f"p50 {m('chain', 'p50_ms'):.1f} ms, p99 {m('chain', 'p99_ms'):.1f} ms",
    )
    report.add(
        "webhook ingest",
        "req/s all new",
        fmt(m("new", "rps")),
        fmt(floor_rps),
        ratio(m("new", "rps"), floor_rps),
        "",
        f"p50 {m('new', 'p50_ms'):.1f} ms, p99 {m('new', 'p99_ms'):.1f} ms",
    )
    report.add(
        "webhook ingest",
        "req/s all duplicates",
        fmt(m("dup", "rps")),
        fmt(m("new", "rps")),
        ratio(m("dup", "rps"), m("new", "rps")),
        "dup/new >= 1.0",
        f"p50 {m('dup', 'p50_ms'):.1f} ms, p99 {m('dup', 'p99_ms'):.1f} ms; floor col = all new",
    )
    report.add(
        "webhook ingest",
        "check",
        f"{events} events, {outbox} outbox rows",
        "",
        "",
        "",
        f"non-2xx+socket errors {errors}; file wrapped: {any(wrapped)}",
    )
    report.dump(args.json)
    report.print("webhook ingest")
    return report


if __name__ == "__main__":
    main()
