"""Bench 2: idempotent replay of POST /api/v1/purchases/{id}/payments at 16 connections.

One real payment is made first (dispatched to localstripe: 201). Then wrk replays the very
same request (same Api-Key, same Idempotency-Key, same body) under gunicorn: every answer
must be 200 with Idempotent-Replayed (the operation's current state), and nothing new may
reach the provider. Floor, same gunicorn, same run: a bare view doing one primary-key
SELECT of the purchase row. For context the authenticated GET /api/v1/purchases/{id} is
measured too.

    .venv/bin/python bench/idempotent_replay.py [--seconds 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    Report,
    bench_stack,
    common_args,
    fmt,
    gunicorn,
    http_json,
    log,
    manage,
    med,
    ratio,
    require_wrk,
    wrk,
)

LUA = Path(__file__).resolve().parent / "lua"


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    args = parser.parse_args(argv)
    require_wrk()
    report = Report()
    with bench_stack() as (stack, env):
        from payments.models import PaymentOperation, Product, ProviderCall

        Product.objects.create(
            sku="BENCH-1", name="Bench item", price=1500, currency="usd", stock=10**6
        )
        key = (
            manage(
                env,
                "create_api_client",
                "bench",
                "--scopes",
                "purchases:read",
                "purchases:write",
                "--limit",
                "0",
            )
            .strip()
            .splitlines()[-1]
            .strip()
        )
        auth = {"Authorization": f"Api-Key {key}"}
        with gunicorn(env, stack, workers=args.workers) as base:
            api = f"{base}/api/v1"
            st, quote = http_json(
                "POST",
                f"{api}/quotes",
                {"items": [{"sku": "BENCH-1", "quantity": 1}], "currency": "usd"},
                {**auth, "Idempotency-Key": "bench-quote"},
            )
            assert st == 201, (st, quote)
            st, purchase = http_json(
                "POST",
                f"{api}/purchases",
                {
                    "quote_id": quote["id"],
                    "quote_version": quote["version"],
                    "customer": {"reference": "bench-cust", "email": "bench@example.com"},
                },
                {**auth, "Idempotency-Key": "bench-purchase"},
            )
            assert st == 201, (st, purchase)
            pid = purchase["id"]
            body = {"payment_method": "pm_card_visa", "capture": "automatic"}
            headers = {**auth, "Idempotency-Key": "bench-pay-1"}
            st, op = http_json("POST", f"{api}/purchases/{pid}/payments", body, headers)
            assert st == 201, (st, op)
            req = urllib.request.Request(
                f"{api}/purchases/{pid}/payments",
                data=json.dumps(body).encode(),
                method="POST",
                headers={"Content-Type": "application/json", **headers},
            )
            with urllib.request.urlopen(req) as r:
                assert r.status == 200 and r.headers.get("Idempotent-Replayed") == "true", (
                    r.status,
                    dict(r.headers),
                )
            calls_before = ProviderCall.objects.count()
            wrk_env = {
                "BENCH_AUTH": auth["Authorization"],
                "BENCH_IDEM_KEY": "bench-pay-1",
                "BENCH_BODY": json.dumps(body),
            }
            res: dict[str, list] = {"floor": [], "replay": [], "get": []}
            for run in range(args.runs):
                log(f"run {run + 1}/{args.runs}: floor GET")
                res["floor"].append(
                    wrk(
                        f"{base}/bench-floor/purchase/{pid}",
                        LUA / "get.lua",
                        seconds=args.seconds,
                        connections=args.connections,
                    )
                )
                log(f"run {run + 1}/{args.runs}: replayed POST …/payments")
                res["replay"].append(
                    wrk(
                        f"{api}/purchases/{pid}/payments",
                        LUA / "same_post.lua",
                        seconds=args.seconds,
                        connections=args.connections,
                        env=wrk_env,
                    )
                )
                log(f"run {run + 1}/{args.runs}: GET /purchases/{{id}}")
                res["get"].append(
                    wrk(
                        f"{api}/purchases/{pid}",
                        LUA / "get.lua",
                        seconds=args.seconds,
                        connections=args.connections,
                        env={"BENCH_AUTH": auth["Authorization"]},
                    )
                )
        new_calls = ProviderCall.objects.count() - calls_before
        ops = PaymentOperation.objects.count()

    def m(kind, attr):
        return med([getattr(r, attr) for r in res[kind]])

    floor = m("floor", "rps")
    bad = sum(r.non2xx + r.errors for rs in res.values() for r in rs)
    note = (
        f"{args.connections} conns, {args.workers} gunicorn workers, "
        f"{args.runs}x{args.seconds:.0f}s"
    )
    report.add(
        "idempotent replay",
        "req/s replayed POST",
        fmt(m("replay", "rps")),
        fmt(floor),
        ratio(m("replay", "rps"), floor),
        ">= 0.60",
        note,
    )
    report.add(
        "idempotent replay",
        "p50 / p99 ms",
        f"{m('replay', 'p50_ms'):.1f} / {m('replay', 'p99_ms'):.1f}",
        f"{m('floor', 'p50_ms'):.1f} / {m('floor', 'p99_ms'):.1f}",
        "",
        "",
        "floor = bare view, one PK SELECT",
    )
    report.add(
        "idempotent replay",
        "req/s GET /purchases/{id}",
        fmt(m("get", "rps")),
        fmt(floor),
        ratio(m("get", "rps"), floor),
        ">= 0.60",
        f"p50 {m('get', 'p50_ms'):.1f} ms, p99 {m('get', 'p99_ms'):.1f} ms",
    )
    report.add(
        "idempotent replay",
        "check",
        f"{ops} operation, {new_calls} new provider calls",
        "",
        "",
        "0 new calls",
        f"non-2xx+socket errors {bad}",
    )
    report.dump(args.json)
    report.print("idempotent replay")
    return report


if __name__ == "__main__":
    main()
