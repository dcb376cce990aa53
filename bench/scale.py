"""Bench 5: do the read paths stay flat as the data grows? 10 k, 100 k, 1 M purchases.

bench/scale_fill.py grows one data set (realistic state mix, INSERT … SELECT
generate_series); at each size every read path is requested through Django's test client
in this process (full middleware, templates, a logged-in `operator` for the console, an
Api-Key for the API): median latency over --reps requests spread over several purchases,
and the query count of each request (min–max). Goal: the same query counts at every size,
p50 < 150 ms at 1 M; the storefront's own list and feed reads (`GET /api/v1/purchases`,
`GET /api/v1/events`, docs/events.md) p50 < 50 ms. `--paths REGEX` measures only the
paths whose name matches. The slowest SQL statement of each path is printed to stderr (what to
EXPLAIN ANALYZE next).

    .venv/bin/python bench/scale.py [--sizes 10000,100000,1000000] [--reps 15]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datetime import UTC

from bench.common import Report, bench_stack, common_args, fmt, log  # noqa: E402
from tools.progress import Progress, eta  # noqa: E402

QUEUES = [
    "unknown",
    "paid_without_order",
    "compensation",
    "quarantined",
    "stuck_outbox",
    "settlement",
    "escalated",
    "refund_approval",
]


def _sql_id(prefix: str, seed: str, g: int, n: int = 24) -> str:
    import hashlib

    return prefix + hashlib.md5(f"{seed}:{g}".encode()).hexdigest()[:n]


def _pick(size: int, bucket_lo: int, bucket_hi: int, k: int, rnd: random.Random) -> list[int]:
    """k purchase numbers g <= size with bucket lo <= g % 200 <= hi, spread over the range."""
    out = []
    while len(out) < k:
        g = rnd.randrange(1, size + 1)
        g = g - g % 200 + rnd.randint(bucket_lo, bucket_hi)
        if 1 <= g <= size:
            out.append(g)
    return out


def paths(size: int, rnd: random.Random) -> dict[str, list[tuple[str, dict]]]:
    """name -> list of (url, extra client kwargs) to cycle through."""
    done = _pick(size, 0, 139, 8, rnd)
    refunded = _pick(size, 180, 187, 4, rnd)
    unknown = _pick(size, 188, 191, 4, rnd)
    p = {}
    p["console dashboard"] = [("/console/", {})]
    for q in QUEUES:
        p[f"console queue {q}"] = [(f"/console/queues/{q}/", {})]
    p["search customer ref"] = [(f"/console/search/?q=cust-{g // 3}", {}) for g in done]
    p["search e-mail"] = [(f"/console/search/?q=cust-{g // 3}%40example.com", {}) for g in done]
    p["search provider ref"] = [(f"/console/search/?q={_sql_id('pi_', 'pi', g)}", {}) for g in done]
    p["search idempotency key"] = [
        (f"/console/search/?q=vk_{_sql_id('', 'k', g, 32)}:confirm", {}) for g in done
    ]
    # The purchases list (support.purchase_list): newest first, a later page by cursor, a
    # rare status, a caller's e-mail, a name (trigram; the fill has no ACP buyer, so this
    # is the cost of a name that matches nothing) and an amount every purchase has.
    from datetime import datetime, timedelta

    from support.purchase_list import cursor_encode

    def created(g: int) -> datetime:  # bench/scale_fill.py's ts
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=25 * g)

    p["purchases list"] = [("/console/purchases/", {})]
    p["purchases list later page"] = [
        (f"/console/purchases/?cursor={cursor_encode(created(g), _sql_id('pur_', 'p', g))}", {})
        for g in done
    ]
    p["purchases list status"] = [
        ("/console/purchases/?status=payment_unknown", {}),
        ("/console/purchases/?status=manual_review", {}),
    ]
    p["purchases search e-mail"] = [
        (f"/console/purchases/?q=cust-{g // 3}%40example.com", {}) for g in done
    ]
    p["purchases search name"] = [("/console/purchases/?q=hopperton", {})]
    p["purchases search amount"] = [
        ("/console/purchases/?q=15.00", {}),
        ("/console/purchases/?q=12.50", {}),
    ]
    p["purchase timeline"] = [
        (f"/console/purchases/{_sql_id('pur_', 'p', g)}/", {}) for g in done + refunded + unknown
    ]
    p["API GET /purchases/{id}"] = [
        (f"/api/v1/purchases/{_sql_id('pur_', 'p', g)}", {"api": True})
        for g in done + refunded + unknown
    ]
    p["customer page /status/"] = [
        (f"/status/{_sql_id('', 't', g, 32)}/", {}) for g in done + refunded + unknown
    ]
    # The storefront's list and feed (an API client reads its own; the fill's purchases
    # all belong to the bench client), each a first page of the default size.
    api = {"api": True}
    p["API GET /purchases"] = [("/api/v1/purchases", api)]
    p["API GET /purchases later page"] = [
        (f"/api/v1/purchases?cursor={cursor}", api) for cursor in _api_cursors(done)
    ]
    p["API GET /purchases status"] = [
        ("/api/v1/purchases?status=payment_unknown", api),
        ("/api/v1/purchases?status=manual_review", api),
    ]
    p["API GET /purchases customer"] = [
        (f"/api/v1/purchases?customer_reference=cust-{g // 3}", api) for g in done
    ]
    p["API GET /purchases amount+created"] = [
        (
            "/api/v1/purchases?amount_min=1000&amount_max=2000&created_after="
            + created(g).isoformat().replace("+00:00", "Z"),
            api,
        )
        for g in done
    ]
    p["API GET /events"] = [("/api/v1/events", api)]
    p["API GET /events after cursor"] = [
        (f"/api/v1/events?after={c}", api) for c in _event_cursors(done)
    ]
    p["API GET /events rare type"] = [
        ("/api/v1/events?type=payment.unknown", api),
        ("/api/v1/events?type=payment.failed", api),
    ]
    p["API GET /events one purchase"] = [
        (f"/api/v1/events?purchase={_sql_id('pur_', 'p', g)}", api) for g in done
    ]
    return p


def _api_cursors(gs: list[int]) -> list[str]:
    """The API list's cursor at each g (made by the API's own encoder)."""
    from payments.api.lists import purchase_list_cursor
    from payments.models import Purchase

    rows = Purchase.objects.filter(pk__in=[_sql_id("pur_", "p", g) for g in gs])
    return [purchase_list_cursor(row) for row in rows]


def _event_cursors(gs: list[int]) -> list[int]:
    from events.models import Event

    return list(
        Event.objects.filter(
            purchase_id__in=[_sql_id("pur_", "p", g) for g in gs], sequence=1
        ).values_list("id", flat=True)
    )


def measure(console, api, targets, reps: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    lat, counts, slowest = [], [], (0.0, "")
    statements: dict[str, float] = {}
    for i in range(reps + 2):
        url, kw = targets[i % len(targets)]
        client = api if kw.get("api") else console
        # The debug log is a deque of 9000: once full, CaptureQueriesContext counts 0.
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as cq:
            t = time.perf_counter()
            r = client.get(url)
            dt = time.perf_counter() - t
        if r.status_code not in (200, 302):
            raise RuntimeError(f"{url}: HTTP {r.status_code}")
        if i < 2:  # warm-up (templates, caches)
            continue
        lat.append(dt * 1000)
        counts.append(len(cq.captured_queries))
        for q in cq.captured_queries:
            statements[q["sql"]] = max(statements.get(q["sql"], 0.0), float(q["time"]) * 1000)
            if float(q["time"]) * 1000 > slowest[0]:
                slowest = (float(q["time"]) * 1000, q["sql"])
    return {
        "p50": statistics.median(lat),
        "qmin": min(counts),
        "qmax": max(counts),
        "slow_ms": slowest[0],
        "slow_sql": slowest[1],
        "statements": sorted(statements.items(), key=lambda kv: -kv[1]),
    }


def explain(statements: list[tuple[str, float]], *, over_ms: float, name: str) -> None:
    """EXPLAIN ANALYZE every distinct statement slower than over_ms (stderr)."""
    from django.db import connection

    for sql, ms in statements:
        if ms < over_ms or "django_session" in sql or "auth_" in sql:
            continue
        with connection.cursor() as c:
            c.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
            plan = "\n".join("      " + r[0] for r in c.fetchall())
        print(f"\n--- {name}: {ms:.1f} ms\n    {sql[:600]}\n{plan}", file=sys.stderr)


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument(
        "--explain",
        type=float,
        default=0,
        metavar="MS",
        help="at the last size, EXPLAIN ANALYZE statements slower than MS",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument(
        "--paths", default="", metavar="REGEX", help="measure only the paths whose name matches"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    report = Report()
    fill_state: dict = {}
    where = {"what": "starting the stack"}

    def status() -> str:
        if where["what"] != "filling" or not fill_state.get("units_total"):
            return where["what"]
        done, total = fill_state["units_done"], fill_state["units_total"]
        elapsed = time.monotonic() - fill_state["started"]
        target = fill_state["rows"] / done * total if done else 0
        return (
            f"filling {where['range']}: {fill_state['phase']}, "
            f"{fill_state['rows']:,} rows written"
            + (f" of ~{target:,.0f}" if target else "")
            + f" ({done / total:.0%}) {eta(done=done, total=total, elapsed=elapsed)}"
        )

    with (
        Progress(status, label="scale", quiet=args.quiet),
        bench_stack(localstripe=False) as (stack, env),
    ):
        from django.contrib.auth.models import Group, User
        from django.test import Client

        from bench.scale_fill import fill
        from payments.clients import api_client_create

        api_client, key = api_client_create(
            name="bench-scale", scopes=["purchases:read"], limit=0, currency="usd"
        )
        user = User.objects.create_user("bench-operator", password="x" * 20)
        # operator (the brief's role) plus finance: the settlement queue is finance-only.
        for role in ("operator", "finance"):
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        console = Client()
        console.force_login(user)
        api = Client(HTTP_AUTHORIZATION=f"Api-Key {key}")
        results: dict[str, dict[int, dict]] = {}
        filled = 0
        for size in sizes:
            log(f"filling purchases {filled + 1:,}..{size:,}")
            where.update(what="filling", range=f"{filled + 1:,}..{size:,}")
            t = time.monotonic()
            fill(filled + 1, size, client_id=api_client.id, log=log, state=fill_state)
            log(f"filled {size:,} purchases in {time.monotonic() - t:.0f}s total")
            filled = size
            rnd = random.Random(size)
            for name, targets in paths(size, rnd).items():
                if args.paths and not re.search(args.paths, name):
                    continue
                where["what"] = f"measuring at {size:,} purchases: {name}"
                r = measure(console, api, targets, args.reps)
                results.setdefault(name, {})[size] = r
                log(
                    f"  {size:>9,} {name:<28} p50 {r['p50']:7.1f} ms  queries "
                    f"{r['qmin']}-{r['qmax']}  slowest {r['slow_ms']:.1f} ms: "
                    f"{r['slow_sql'][:160]}"
                )
                if args.explain and size == sizes[-1]:
                    explain(r["statements"], over_ms=args.explain, name=name)
    for name, by_size in results.items():
        qs = {
            f"{r['qmin']}" if r["qmin"] == r["qmax"] else f"{r['qmin']}-{r['qmax']}"
            for r in by_size.values()
        }
        flat = "flat" if len(qs) == 1 else "GROWS"
        worst = by_size[max(by_size)]
        value = "  ".join(f"{s // 1000}k:{fmt(by_size[s]['p50'], 1)}" for s in sorted(by_size))
        queries = " / ".join(
            f"{by_size[s]['qmin']}"
            if by_size[s]["qmin"] == by_size[s]["qmax"]
            else f"{by_size[s]['qmin']}-{by_size[s]['qmax']}"
            for s in sorted(by_size)
        )
        bound = (
            50
            if name.startswith(("API GET /purchases", "API GET /events")) and "{id}" not in name
            else 150
        )
        goal = f"p50 < {bound} ms" + (" ok" if worst["p50"] < bound else " MISSED")
        report.add("scale", name, value, "", "", goal, f"queries {queries} ({flat})")
    report.dump(args.json)
    report.print("scale (p50 ms per size; queries per request per size)")
    return report


if __name__ == "__main__":
    main()
