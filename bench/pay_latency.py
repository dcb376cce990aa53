"""Bench: what one payment costs through Verity against a direct provider integration.

Every provider answer is delayed by a fixed hold (bench/fault_proxy.py, 100 ms by default),
as a real provider's latency would be. Measured through that same proxy, sequentially and
at --connections concurrent clients, each a fresh purchase paid once:

  - direct: the provider SDK's `PaymentIntent.create(confirm=true)` under an idempotency
    key (the floor: what a direct server-side integration pays),
  - REST: `POST /api/v1/purchases/{id}/payments` under gunicorn,
  - ACP: `POST /acp/checkout_sessions/{id}/complete` with a shared payment token,
  - MCP: the `pay_purchase` tool over the MCP server's streamable HTTP transport as the
    Django app mounts it (`POST /mcp/`, one JSON-RPC `tools/call`, stateless JSON: the
    request an MCP client sends for the call, through agents.views and agents.server into
    agents.tools.pay_purchase), under the same gunicorn.

Both payment modes of Verity can be measured (--modes): `one-call` (the provider dedupes
keys: localstripe's idempotency layer on, STRIPE_DEDUPES_KEYS=true, one round trip) and
`two-step` (create, store the id, confirm). Each row prints p50 and p99 in ms, the ratio
of the direct call's latency to Verity's (1.00 = as fast as a direct integration), and
the provider calls per payment from Verity's own ProviderCall rows.

`--hold 0` gives Verity's own time per payment; `--profile` adds, in this process (no
HTTP), the SQL statements one REST payment runs, by kind, with the purchase and quote
creation beside it. `--durable` runs PostgreSQL with synchronous_commit on (as
production); every row says which.

`--downstream` runs one Celery worker (solo pool, with its embedded beat: the outbox
sweep behind the commit kicks) while the payments are made, and reports per face and
series the time from "paid" (the purchase's `paid_at`) to "completed" (its status
transition to `completed`): the five downstream steps through the outbox and the worker,
under the load of the payments around them.

    .venv/bin/python bench/pay_latency.py [--hold 0.1] [--payments 40] [--connections 16]
        [--modes one-call,two-step] [--faces rest,acp,mcp] [--profile] [--downstream]
        [--durable] [--runs 1]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    BIN,
    ROOT,
    Report,
    bench_stack,
    common_args,
    durable,
    gunicorn,
    log,
    manage,
)
from bench.fault_proxy import FaultProxy  # noqa: E402

ACP_API_VERSION = "2026-04-17"
SKU = "BENCH-PAY"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


FAILURES: list[str] = []


def _parallel(items: list, connections: int, fn) -> list[float]:
    """Run fn(connection_state, item) over items on `connections` threads, each with its
    own keep-alive connection; returns the latencies in ms of the payments that answered
    as expected (the others are counted in FAILURES, with what came back)."""
    out: list[float] = []
    lock = threading.Lock()
    shares = [items[i::connections] for i in range(connections)]

    def worker(share):
        state: dict = {}
        for item in share:
            t = time.perf_counter()
            try:
                fn(state, item)
            except Exception as exc:  # noqa: BLE001 - counted and shown, the run goes on
                with lock:
                    FAILURES.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                if state.get("conn"):
                    state.pop("conn").close()
                continue
            ms = (time.perf_counter() - t) * 1000
            with lock:
                out.append(ms)
        if state.get("conn"):
            state["conn"].close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in shares if s]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _post(state: dict, base: str, path: str, body: dict, headers: dict) -> tuple[int, dict]:
    conn = state.get("conn")
    if conn is None:
        host, port = base.replace("http://", "").split(":")
        conn = state["conn"] = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **headers}
    )
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"{}")


def _localstripe_idempotency(base: str, **config) -> None:
    data = "&".join(f"{k}={v}" for k, v in config.items()).encode()
    urllib.request.urlopen(
        urllib.request.Request(f"{base}/_config/idempotency", data=data), timeout=10
    ).read()


def _purchases(client, n: int, tag: str) -> list[str]:
    from payments import services

    out = []
    for i in range(n):
        quote = services.quote_create(
            api_client=client, items=[{"sku": SKU, "quantity": 1}], currency="usd"
        )
        purchase = services.purchase_create(
            api_client=client,
            quote_id=quote.id,
            quote_version=quote.version,
            customer_reference=f"bench-{tag}-{i}-{uuid.uuid4().hex[:6]}",
        )
        out.append(purchase.id)
    return out


def _direct(proxy_base: str, n: int, connections: int) -> list[float]:
    import stripe
    from django.conf import settings

    client = stripe.StripeClient(
        settings.STRIPE_API_KEY, base_addresses={"api": proxy_base}, max_network_retries=0
    )
    client.v1.payment_intents.create(
        params={
            "amount": 1500,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "confirm": True,
        }
    )  # warm the connection pool

    def pay(_state, i):
        pi = client.v1.payment_intents.create(
            params={
                "amount": 1500,
                "currency": "usd",
                "payment_method": "pm_card_visa",
                "capture_method": "automatic",
                "confirm": True,
                "metadata": {"operation_id": f"direct-{i}"},
            },
            options={"idempotency_key": f"direct-{uuid.uuid4().hex}:pay"},
        )
        assert pi.status == "succeeded", pi.status

    return _parallel(list(range(n)), connections, pay)


def _rest(base: str, key: str, pids: list[str], connections: int) -> list[float]:
    auth = {"Authorization": f"Api-Key {key}"}

    def pay(state, pid):
        st, body = _post(
            state,
            base,
            f"/api/v1/purchases/{pid}/payments",
            {"payment_method": "pm_card_visa", "capture": "automatic"},
            {**auth, "Idempotency-Key": f"pay-{pid}"},
        )
        assert st == 201, (st, body)

    return _parallel(pids, connections, pay)


def _acp(base: str, key: str, stripe_base: str, n: int, connections: int) -> list[float]:
    """Sessions are opened untimed; `complete` (the payment) is timed."""
    headers = {"Authorization": f"Bearer {key}", "API-Version": ACP_API_VERSION}
    state: dict = {}
    sessions = []
    for _ in range(n):
        st, s = _post(
            state,
            base,
            "/acp/checkout_sessions",
            {
                "line_items": [{"id": SKU, "quantity": 1}],
                "currency": "usd",
                "capabilities": {"interventions": {"supported": []}},
            },
            {
                **headers,
                "Idempotency-Key": str(uuid.uuid4()),
                "Request-Id": f"req_{uuid.uuid4().hex[:10]}",
            },
        )
        assert st == 201, (st, s)
        total = next(t["amount"] for t in s["totals"] if t["type"] == "total")
        data = (
            f"payment_method=pm_card_visa&usage_limits[currency]=usd&"
            f"usage_limits[max_amount]={total}&usage_limits[expires_at]="
            f"{int(time.time()) + 3600}"
        ).encode()
        with urllib.request.urlopen(
            urllib.request.Request(
                f"{stripe_base}/v1/test_helpers/shared_payment/granted_tokens",
                data=data,
                headers={"Authorization": "Bearer sk_test_verity_local"},
            ),
            timeout=10,
        ) as r:
            sessions.append((s["id"], json.loads(r.read())["id"]))
    state["conn"].close()

    def complete(state, item):
        sid, token = item
        st, body = _post(
            state,
            base,
            f"/acp/checkout_sessions/{sid}/complete",
            {
                "buyer": {"first_name": "Ada", "email": f"{sid}@example.com"},
                "payment_data": {"provider": "stripe", "token": token},
            },
            {
                **headers,
                "Idempotency-Key": str(uuid.uuid4()),
                "Request-Id": f"req_{uuid.uuid4().hex[:10]}",
            },
        )
        assert st == 200 and body.get("status") == "completed", (st, body)

    return _parallel(sessions, connections, complete)


def _mcp(base: str, key: str, pids: list[str], connections: int) -> list[float]:
    """One JSON-RPC `tools/call` of `pay_purchase` per purchase, as an MCP client sends it
    to the streamable HTTP endpoint (stateless: no session to open first)."""
    headers = {"Authorization": f"Api-Key {key}", "Accept": "application/json, text/event-stream"}

    def pay(state, pid):
        st, body = _post(
            state,
            base,
            "/mcp/",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "pay_purchase",
                    "arguments": {"purchase_id": pid, "payment_method": "pm_card_visa"},
                },
            },
            headers,
        )
        result = body.get("result") or {}
        found = result.get("structuredContent")
        if found is None:
            found = json.loads(result["content"][0]["text"])
        outcome = (found.get("operation") or {}).get("outcome")
        assert st == 200 and outcome == "succeeded", (st, str(body)[:300])

    return _parallel(pids, connections, pay)


def _paid_to_completed(since, timeout: float) -> tuple[list[float], list[float], int]:
    """For the purchases paid since `since` (waiting up to `timeout` s for them to
    complete): ms from `paid_at` to the `completed` transition, the part of it spent
    before the worker started the steps (paid -> `fulfilling`: the commit's kick, the
    broker, the messages ahead in the worker), and how many never completed."""
    from django.db.models import Min, OuterRef, Subquery

    from payments.models import OperationTransition, Purchase

    def entered(status: str):
        return Subquery(
            OperationTransition.objects.filter(
                purchase_id=OuterRef("pk"), field="status", operation__isnull=True, target=status
            )
            .values("purchase_id")
            .annotate(at=Min("created_at"))
            .values("at")
        )

    deadline = time.monotonic() + timeout
    while True:
        rows = list(
            Purchase.objects.filter(paid_at__gte=since)
            .annotate(started=entered("fulfilling"), done=entered("completed"))
            .values_list("paid_at", "started", "done")
        )
        waiting = sum(1 for *_, done in rows if done is None)
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    total = [(done - paid).total_seconds() * 1000 for paid, _, done in rows if done]
    queued = [(started - paid).total_seconds() * 1000 for paid, started, done in rows if done]
    return total, queued, waiting


@contextlib.contextmanager
def _worker(env: dict, stack):
    """One Celery worker (solo pool) with its embedded beat, as bench/history.py starts
    one, on the bench's database and broker."""
    from config.celery import app

    logf = open(stack.tmp / "celery-pay-latency.log", "ab")
    proc = subprocess.Popen(
        [
            str(BIN / "celery"),
            "-A",
            "config",
            "worker",
            "-B",
            "-s",
            str(stack.tmp / "celerybeat-pay-latency"),
            "--pool",
            "solo",
            "-n",
            "pay-latency@%h",
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
                tail = (stack.tmp / "celery-pay-latency.log").read_text()[-2000:]
                raise RuntimeError(f"celery worker not ready: {tail}")
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _calls_per_payment(since_ops: set[str]) -> str:
    from payments.models import PaymentOperation, ProviderCall

    ops = (
        set(
            PaymentOperation.objects.filter(kind__in=("charge", "authorize")).values_list(
                "id", flat=True
            )
        )
        - since_ops
    )
    writes = ProviderCall.objects.filter(
        operation_id__in=ops, purpose__in=("dispatch", "replay")
    ).count()
    return f"{writes / len(ops):.2f}" if ops else "n/a"


def _post_quote(http, auth: dict) -> dict:
    r = http.post(
        "/api/v1/quotes",
        {"items": [{"sku": SKU, "quantity": 1}], "currency": "usd"},
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
        **auth,
    )
    assert r.status_code == 201, r.content
    return r.json()


def _post_purchase(http, auth: dict, quote: dict) -> str:
    r = http.post(
        "/api/v1/purchases",
        {
            "quote_id": quote["id"],
            "quote_version": quote["version"],
            "customer": {"reference": f"prof-{uuid.uuid4().hex[:8]}", "email": "p@example.com"},
        },
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
        **auth,
    )
    assert r.status_code == 201, r.content
    return r.json()["id"]


def _profile(client, key: str, one_call: bool) -> dict:
    """SQL statements of one REST payment in this process (Django's test client), by
    kind, and of the quote and purchase creation before it."""
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.STRIPE_DEDUPES_KEYS = one_call
    http = Client()
    auth = {"HTTP_AUTHORIZATION": f"Api-Key {key}"}
    out = {}
    for _warm in range(2):
        with CaptureQueriesContext(connection) as quote_q:
            quote = _post_quote(http, auth)
        with CaptureQueriesContext(connection) as purchase_q:
            pid = _post_purchase(http, auth, quote)
        with CaptureQueriesContext(connection) as pay_q:
            t = time.perf_counter()
            r = http.post(
                f"/api/v1/purchases/{pid}/payments",
                {"payment_method": "pm_card_visa", "capture": "automatic"},
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
                **auth,
            )
            wall = (time.perf_counter() - t) * 1000
            assert r.status_code == 201, r.content
    for name, q in (("quote", quote_q), ("purchase", purchase_q), ("payment", pay_q)):
        kinds = Counter(s["sql"].split(None, 1)[0].upper() for s in q.captured_queries)
        out[name] = {
            "statements": len(q.captured_queries),
            "kinds": dict(kinds),
            "db_ms": round(sum(float(s["time"]) for s in q.captured_queries) * 1000, 1),
        }
    out["payment"]["wall_ms"] = round(wall, 1)
    out["layers"] = _layer_profile(http, auth)
    return out


# Own time by layer for a payment (bench/profile_reads.py's split, with the provider's
# SDK and its socket beside the ORM): first match wins.
PAY_LAYERS = [
    ("PostgreSQL + psycopg (waits included)", ("/psycopg/", "/psycopg_binary/", "psycopg")),
    ("SQL compile (django.db.models.sql)", ("/django/db/models/sql/",)),
    ("ORM, the rest (querysets, models)", ("/django/db/",)),
    ("provider SDK (stripe)", ("/stripe/",)),
    ("provider HTTP (requests, urllib3, socket)", ("/requests/", "/urllib3/", "socket")),
    ("DRF", ("/rest_framework/",)),
    ("Django request + middleware", ("/django/",)),
    ("Verity", ("/payments/", "/recovery/", "/events/", "/api/", "/config/", "/support/")),
]


def _layer_profile(http, auth: dict, n: int = 30) -> dict[str, float]:
    """ms per payment by layer under cProfile: n REST payments of purchases made first
    (outside the profile). cProfile inflates every figure: read them as shares."""
    import cProfile

    from bench.profile_reads import _layers

    pids = [_post_purchase(http, auth, _post_quote(http, auth)) for _ in range(n)]
    profile = cProfile.Profile()
    t = time.perf_counter()
    profile.enable()
    for pid in pids:
        r = http.post(
            f"/api/v1/purchases/{pid}/payments",
            {"payment_method": "pm_card_visa", "capture": "automatic"},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
            **auth,
        )
    profile.disable()
    wall = (time.perf_counter() - t) * 1000 / n
    assert r.status_code == 201, r.content
    layers = _layers(profile, n, PAY_LAYERS)
    return {"wall ms per payment, profiled": wall, **layers}


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--hold", type=float, default=0.1, help="seconds per provider answer")
    parser.add_argument("--payments", type=int, default=40, help="payments per series")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument("--modes", default="one-call", help="one-call,two-step")
    parser.add_argument("--no-acp", action="store_true", help="same as --faces without acp")
    parser.add_argument("--faces", default="rest,acp,mcp", help="rest,acp,mcp")
    parser.add_argument(
        "--downstream",
        action="store_true",
        help="run a Celery worker and report paid -> completed (the five steps)",
    )
    parser.add_argument(
        "--downstream-timeout", type=float, default=120.0, help="s to wait for completions"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also count the SQL statements of one payment, in-process",
    )
    args = parser.parse_args(argv)
    report = Report()
    # At 16 connections, gunicorn needs as many workers as connections for the hold to be
    # waited in parallel (sync workers block on the provider call).
    with bench_stack() as (stack, env):
        from django.utils import timezone

        from payments.clients import api_client_create
        from payments.models import PaymentOperation, Product

        Product.objects.create(sku=SKU, name="Bench item", price=1500, currency="usd", stock=10**7)
        key = (
            manage(
                env,
                "create_api_client",
                "bench-pay",
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
        acp_key = (
            manage(env, "create_api_client", "bench-acp", "--scopes", "acp", "--limit", "0")
            .strip()
            .splitlines()[-1]
            .strip()
        )
        from payments.models import ApiClient

        client = ApiClient.objects.get(name="bench-pay")
        stripe_base = env["STRIPE_API_BASE"]
        proxy = FaultProxy(stack.localstripe_port)
        proxy.up()
        proxy.hold(args.hold)
        series = [("sequential", 1), (f"{args.connections} conns", args.connections)]
        direct = {name: [] for name, _ in series}
        for name, conns in series:
            for _ in range(args.runs):
                log(f"direct create(confirm=true), {name}")
                direct[name] += _direct(proxy.base, args.payments, conns)
        commit_note = f"synchronous_commit {'on' if durable() else 'off'}"
        hold_note = f"hold {args.hold * 1000:.0f} ms per provider answer; {commit_note}"
        faces_wanted = {f.strip() for f in args.faces.split(",") if f.strip()}
        if args.no_acp:
            faces_wanted.discard("acp")
        for name, _ in series:
            d = direct[name]
            report.add(
                "pay latency",
                f"direct create(confirm) {name} p50 / p99 ms",
                f"{_pct(d, 0.5):.1f} / {_pct(d, 0.99):.1f}",
                "",
                "",
                "",
                f"{hold_note}; the floor; 1 provider call",
            )
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            one_call = mode == "one-call"
            _localstripe_idempotency(stripe_base, enabled="true" if one_call else "false")
            genv = {
                **env,
                "STRIPE_API_BASE": proxy.base,
                "STRIPE_DEDUPES_KEYS": "true" if one_call else "false",
            }
            with contextlib.ExitStack() as running:
                base = running.enter_context(
                    gunicorn(genv, stack, workers=max(args.workers, args.connections))
                )
                if args.downstream:
                    running.enter_context(_worker(genv, stack))
                faces = []
                if "rest" in faces_wanted:
                    faces.append(
                        (
                            "REST POST /payments",
                            lambda conns, n, tag, base=base: _rest(
                                base, key, _purchases(client, n, tag), conns
                            ),
                        )
                    )
                if "acp" in faces_wanted:
                    faces.append(
                        (
                            "ACP complete",
                            lambda conns, n, tag, base=base: _acp(
                                base, acp_key, stripe_base, n, conns
                            ),
                        )
                    )
                if "mcp" in faces_wanted:
                    faces.append(
                        (
                            "MCP pay_purchase",
                            lambda conns, n, tag, base=base: _mcp(
                                base, key, _purchases(client, n, tag), conns
                            ),
                        )
                    )
                for face, run in faces:
                    for name, conns in series:
                        before = set(PaymentOperation.objects.values_list("id", flat=True))
                        failed_before = len(FAILURES)
                        lat: list[float] = []
                        series_start = timezone.now()
                        for r in range(args.runs):
                            log(f"{mode}: {face}, {name}, run {r + 1}/{args.runs}")
                            lat += run(conns, args.payments, f"{mode}-{name}-{r}")
                        calls = _calls_per_payment(before)
                        d = direct[name]
                        p50, p99 = _pct(lat, 0.5), _pct(lat, 0.99)
                        report.add(
                            "pay latency",
                            f"{mode}: {face} {name} p50 / p99 ms",
                            f"{p50:.1f} / {p99:.1f}",
                            f"{_pct(d, 0.5):.1f} / {_pct(d, 0.99):.1f}",
                            f"{_pct(d, 0.5) / p50:.2f} / {_pct(d, 0.99) / p99:.2f}",
                            ">= 0.85" if args.hold else "",
                            f"{hold_note}; provider calls per payment {calls}; "
                            f"n={len(lat)}, "
                            f"mean {statistics.mean(lat) if lat else float('nan'):.1f} ms"
                            + (
                                f"; {len(FAILURES) - failed_before} not answered as "
                                f"expected (first: {FAILURES[failed_before]})"
                                if len(FAILURES) > failed_before
                                else ""
                            ),
                        )
                        if args.downstream:
                            log(f"{mode}: {face}, {name}: waiting for paid -> completed")
                            done, queued, waiting = _paid_to_completed(
                                series_start, args.downstream_timeout
                            )
                            report.add(
                                "pay latency",
                                f"{mode}: {face} {name} paid -> completed p50 / p99 ms",
                                f"{_pct(done, 0.5):.1f} / {_pct(done, 0.99):.1f}",
                                "",
                                "",
                                "",
                                f"five steps through the outbox, 1 Celery worker (solo, "
                                f"embedded beat); of it, paid -> fulfilling (kick, broker, "
                                f"messages ahead) p50 / p99 {_pct(queued, 0.5):.1f} / "
                                f"{_pct(queued, 0.99):.1f} ms; {commit_note}; n={len(done)}"
                                + (f"; {waiting} not completed in time" if waiting else ""),
                            )
        proxy.down()
        if args.profile:
            from django.conf import settings

            settings.STRIPE_API_BASE = stripe_base
            from payments.providers.stripe import get_provider

            get_provider.cache_clear()
            _, prof_key = api_client_create(
                name="bench-profile",
                scopes=["purchases:read", "purchases:write"],
                limit=0,
                currency="usd",
            )
            from payments.models import ApiClient as _C  # noqa: F401

            for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
                one_call = mode == "one-call"
                _localstripe_idempotency(stripe_base, enabled="true" if one_call else "false")
                prof = _profile(client, prof_key, one_call)
                report.add(
                    "pay profile",
                    f"{mode}: own time per payment by layer (cProfile, 30 payments)",
                    f"{prof['layers']['wall ms per payment, profiled']:.1f} ms",
                    "",
                    "",
                    "",
                    "; ".join(
                        f"{k} {v:.1f}"
                        for k, v in sorted(prof["layers"].items(), key=lambda kv: -kv[1])
                        if k != "wall ms per payment, profiled"
                    )
                    + f"; {commit_note}",
                )
                for name in ("quote", "purchase", "payment"):
                    p = prof[name]
                    kinds = ", ".join(f"{k} {v}" for k, v in sorted(p["kinds"].items()))
                    report.add(
                        "pay profile",
                        f"{mode}: SQL statements per {name}",
                        str(p["statements"]),
                        "",
                        "",
                        "<= 20" if name == "payment" else "",
                        f"{kinds}; {p['db_ms']} ms in PostgreSQL; {commit_note}"
                        + (
                            f"; {p['wall_ms']} ms wall in-process, no hold"
                            if "wall_ms" in p
                            else ""
                        ),
                    )
    report.dump(args.json)
    report.print("pay latency")
    return report


if __name__ == "__main__":
    main()
