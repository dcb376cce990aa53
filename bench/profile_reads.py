"""Where a read's time goes, per layer, in one process.

CPU seconds per request are much steadier than requests/s on a shared, loaded machine, so
this complements bench/idempotent_replay.py: the same three requests (the floor's bare
primary-key read, a replayed payment, `GET /purchases/{id}`) are sent N times through the
full Django stack in this process (django.test.Client: every middleware, no socket), once
with the fast path (payments.api.fast_path) and once without it (the DRF view alone). For
each: wall and CPU ms per request, and a cProfile split of the time by layer (the ORM,
DRF, psycopg + PostgreSQL wait, Redis, Django's request/middleware machinery, the rest).

    .venv/bin/python bench/profile_reads.py [--n 200] [--rounds 5] [--durable] [--json out.json]

CPU ms is the least of --rounds interleaved rounds (the least disturbed on a loaded
machine); the layer split comes from one more, profiled round (cProfile inflates every
figure in it, and its wall time includes waiting for PostgreSQL: read it as shares).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Report, bench_stack, common_args, log, manage  # noqa: E402

# (layer, substrings of a function's file path) — first match wins, by own (tottime) time.
LAYERS = [
    ("PostgreSQL + psycopg", ("/psycopg/", "/psycopg_binary/", "psycopg")),
    ("Redis", ("/redis/",)),
    ("ORM (django.db)", ("/django/db/",)),
    ("DRF", ("/rest_framework/", "/drf_spectacular/")),
    ("Django request + middleware", ("/django/",)),
    ("Verity (payments, recovery)", ("/payments/", "/recovery/", "/config/", "/bench/")),
]


def _layers(
    profile: cProfile.Profile, n: int, layers: list[tuple[str, tuple[str, ...]]] = LAYERS
) -> dict[str, float]:
    """Own (tottime) ms per request by layer: the first layer whose marks the function's
    file (or a C builtin's name) contains."""
    stats = pstats.Stats(profile)
    out: dict[str, float] = {name: 0.0 for name, _ in layers}
    out["other (stdlib, json, hashing)"] = 0.0
    for (filename, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        where = filename if filename != "~" else func  # C builtins: file "~"
        for name, marks in layers:
            if any(m in where for m in marks):
                out[name] += tottime
                break
        else:
            out["other (stdlib, json, hashing)"] += tottime
    return {k: v * 1000 / n for k, v in out.items()}


def _round_trips(profile: cProfile.Profile, n: int) -> tuple[float, float]:
    """(psycopg waits, Redis replies) per request. Outside a pipeline psycopg waits once
    per statement, a round trip; inside one (the purchase view's reads) it also waits to
    send each statement, so 7 waits there are ONE round trip (strace: one burst of sends,
    then the replies). redis-py reads one reply per command (the fast paths send one)."""
    pg = redis = 0
    for (filename, _line, func), (_cc, ncalls, *_rest) in pstats.Stats(profile).stats.items():
        if func == "wait" and filename.endswith("psycopg/connection.py"):
            pg += ncalls
        elif func == "read_response" and filename.endswith("redis/connection.py"):
            redis += ncalls
    return pg / n, redis / n


TOP = 0  # --top N: print each case's N costliest functions (own time) on stderr
SORT = "tottime"  # --sort: a pstats key for --top (tottime, cumulative)


def _timed(send, n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        send()
    return (time.perf_counter() - wall) * 1000 / n, (time.process_time() - cpu) * 1000 / n


def _measure(
    send, n: int, *, profile: bool, timed: list | None = None
) -> tuple[float, float, dict]:
    """(wall ms, CPU ms, layers). `timed`: (wall, cpu) of earlier rounds of this case; the
    least of them is kept (on a loaded machine the least is the least disturbed)."""
    for _ in range(20):  # warm: caches, prepared statements, the client cache
        send()
    rounds = list(timed or []) + [_timed(send, n)]
    wall, cpu = min(w for w, _ in rounds), min(c for _, c in rounds)
    layers = {}
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            send()
        prof.disable()
        layers = _layers(prof, n)
        layers["PG round trips"], layers["Redis round trips"] = _round_trips(prof, n)
        if TOP:
            pstats.Stats(prof, stream=sys.stderr).sort_stats(SORT).print_stats(TOP)
    return wall, cpu, layers


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--n", type=int, default=200, help="requests per figure")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="timed rounds per case, interleaved; the least is kept",
    )
    parser.add_argument("--top", type=int, default=0, help="print the N costliest functions")
    parser.add_argument("--sort", default="tottime", help="--top's order: tottime, cumulative")
    parser.add_argument("--only", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    global TOP, SORT
    TOP, SORT = args.top, args.sort
    report = Report()
    with bench_stack() as (stack, env):
        from django.conf import settings
        from django.test import Client

        from payments.models import Product

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
        http = Client(HTTP_AUTHORIZATION=f"Api-Key {key}")

        def post(path, body, idem):
            return http.post(path, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=idem)

        quote = post(
            "/api/v1/quotes", {"items": [{"sku": "BENCH-1", "quantity": 1}], "currency": "usd"}, "q"
        ).json()
        purchase = post(
            "/api/v1/purchases",
            {
                "quote_id": quote["id"],
                "quote_version": quote["version"],
                "customer": {"reference": "bench-cust", "email": "bench@example.com"},
            },
            "p",
        ).json()
        pid = purchase["id"]
        body = {"payment_method": "pm_card_visa", "capture": "automatic"}
        assert post(f"/api/v1/purchases/{pid}/payments", body, "pay").status_code == 201

        def replay():
            r = post(f"/api/v1/purchases/{pid}/payments", body, "pay")
            assert r.status_code == 200, r.content

        def get():
            r = http.get(f"/api/v1/purchases/{pid}")
            assert r.status_code == 200, r.content

        floor_http = Client()

        def floor():
            r = floor_http.get(f"/bench-floor/purchase/{pid}")
            assert r.status_code == 200

        cases = [("floor (bare PK read)", floor, None)]
        for fast in (False, True):
            label = "fast path" if fast else "DRF view"
            cases += [
                (f"replayed POST, {label}", replay, fast),
                (f"GET /purchases/{{id}}, {label}", get, fast),
            ]
        results = {}
        cases = [c for c in cases if not args.only or args.only in c[0] or c[0].startswith("floor")]
        rounds: dict[str, list] = {name: [] for name, _, _ in cases}
        for i in range(args.rounds):  # interleaved: a load spike hits every case alike
            log(f"round {i + 1}/{args.rounds}: {len(cases)} cases x {args.n} requests")
            for name, send, fast in cases:
                if fast is not None:
                    settings.API_FAST_PATH = fast
                send()
                rounds[name].append(_timed(send, args.n))
        for name, send, fast in cases:
            if fast is not None:
                settings.API_FAST_PATH = fast
            log(f"{name}: profiled, {args.n} requests")
            results[name] = _measure(send, args.n, profile=True, timed=rounds[name])
    floor_cpu = results["floor (bare PK read)"][1]
    for name, (wall, cpu, layers) in results.items():
        trips = (
            f"psycopg waits {layers.pop('PG round trips', 0):.1f}, "
            f"Redis replies {layers.pop('Redis round trips', 0):.1f}"
        )
        split = ", ".join(f"{k} {v:.2f}" for k, v in layers.items() if v >= 0.005)
        report.add(
            "read profile",
            name,
            f"{cpu:.2f} ms CPU",
            f"{floor_cpu:.2f}",
            f"{floor_cpu / cpu:.2f}" if cpu else "n/a",
            "",
            f"wall {wall:.2f} ms; {trips}; profiled ms: {split}",
        )
    report.dump(args.json)
    report.print("read profile (per request, in one process; ratio = floor CPU / CPU)")
    return report


if __name__ == "__main__":
    main()
