"""Storefront webhook delivery: events/s to a local receiver through events.delivery,
against a bare signed POST loop to the same receiver in the same run.

N events of N purchases (one client, one endpoint whose in-flight bound is the sender's
thread count) are written with their deliveries, then sent by
`events.delivery.deliveries_send_all_due()` in this process: the claim (advisory-locked,
per-endpoint and per-purchase bounds), the send-time address check, Standard Webhooks
signing with the `standardwebhooks` package, one connection per POST to the checked
address, and the settle (attempt log row, delivery row, endpoint row) per delivery.
Floor: the same bodies, signed with the same package, POSTed by the same number of
threads over kept-alive connections, with no database at all. The receiver is a
separate process answering 204 (its cost is in both figures).

    .venv/bin/python bench/webhook_delivery.py [--events 2000] [--runs 3] [--profile]
        [--baseline main]

--profile counts SQL statements per delivered event and the time per phase; --baseline
REF measures events/delivery.py as at git REF in the same runs, alternating with today's
(on a shared, loaded machine, figures from separate invocations differ by more than a
change to the loop does).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Report, bench_stack, common_args, fmt, log, med, ratio  # noqa: E402


def _serve(port_queue) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive for the floor's pooled connections

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_queue.put(server.server_port)
    server.serve_forever()


def _fill(n: int, tag: str, url: str, threads: int, *, deliveries: bool = True):
    from events.models import Event, WebhookDelivery, WebhookEndpoint

    endpoint = WebhookEndpoint.objects.create(
        api_client_id=f"bench-{tag}", url=url, max_in_flight=threads
    )
    now = datetime.now(UTC)
    events = Event.objects.bulk_create(
        [
            Event(
                api_client_id=f"bench-{tag}",
                purchase_id=f"pur_bench_{tag}_{i}",
                sequence=1,
                type="payment.succeeded",
                created_at=now,
                data={
                    "purchase": {
                        "id": f"pur_bench_{tag}_{i}",
                        "status": "paid",
                        "amount": 2500,
                        "currency": "usd",
                    },
                    "operation": {"id": f"op_bench_{i}", "outcome": "succeeded"},
                },
            )
            for i in range(n)
        ]
    )
    if not deliveries:
        return endpoint, events
    WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(
                endpoint=endpoint,
                event=e,
                purchase_id=e.purchase_id,
                next_attempt_at=now,
                give_up_at=now + timedelta(days=3),
            )
            for e in events
        ]
    )
    return endpoint, events


def baseline_module(ref: str):
    """events/delivery.py as it was at git `ref`, loaded beside today's (its fan-out
    handler not registered again): measured in the same process, stack and receiver,
    alternating with today's, so a loaded machine weighs on both alike."""
    import subprocess
    import types

    source = subprocess.run(
        ["git", "show", f"{ref}:events/delivery.py"],
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    source = source.replace("\nfrom .", "\nfrom events.").replace(
        "\n@outbox_handler(OutboxCategory.EVENT_FANOUT)\n", "\n"
    )
    module = types.ModuleType(f"events_delivery_at_{ref}")
    exec(compile(source, f"{ref}:events/delivery.py", "exec"), module.__dict__)
    return module


def run_verity(n: int, url: str, threads: int, tag: str, module=None) -> float:
    from events import delivery
    from events.models import WebhookDelivery

    send_all = (module or delivery).deliveries_send_all_due
    endpoint, _ = _fill(n, tag, url, threads)
    started = time.perf_counter()
    while send_all(max_batches=1000):
        pass
    took = time.perf_counter() - started
    left = WebhookDelivery.objects.filter(endpoint=endpoint).exclude(state="delivered").count()
    if left:
        raise RuntimeError(f"{left} deliveries not delivered")
    return n / took


def run_profile(n: int, url: str, threads: int, tag: str) -> dict:
    """One run with every SQL statement counted and the time split by phase (claim, read,
    send, settle): where a delivered event's cost goes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from events import delivery

    _fill(n, tag, url, threads)
    spent: dict[str, float] = {}
    originals = {}

    def timed(name: str):
        fn = getattr(delivery, name)
        originals[name] = fn

        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

        setattr(delivery, name, wrapper)

    for name in PHASES:
        if hasattr(delivery, name):
            timed(name)
    try:
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            sent = 0
            while batch := delivery.deliveries_send_all_due(max_batches=1000):
                sent += batch
        took = time.perf_counter() - started
    finally:
        for name, fn in originals.items():
            setattr(delivery, name, fn)
    return {
        "events": sent,
        "statements": len(queries.captured_queries),
        "seconds": took,
        "phases": spent,
    }


# The functions of events.delivery whose time the profile reports (those it has).
PHASES = ("_claim", "_claimed", "_load", "_send_batch", "_settle_all", "is_halted")


def run_floor(n: int, url: str, threads: int, tag: str) -> float:
    import urllib3
    from standardwebhooks.webhooks import Webhook

    from events.selectors import event_document

    # The same rows, read from memory only. No deliveries: rows left pending here would be
    # sent by the next events.delivery run and counted as none of its own.
    _, events = _fill(n, tag, url, threads, deliveries=False)
    bodies = [(e.public_id, json.dumps(event_document(e), separators=(",", ":"))) for e in events]
    wh = Webhook("whsec_" + "QmVuY2hTZWNyZXRCZW5jaFNlY3JldEJlbmNoU2VjcmV0")
    pool = urllib3.PoolManager(maxsize=threads)

    def post(item):
        msg_id, body = item
        at = datetime.now(UTC)
        r = pool.request(
            "POST",
            url,
            body=body.encode(),
            headers={
                "webhook-id": msg_id,
                "webhook-timestamp": str(int(at.timestamp())),
                "webhook-signature": wh.sign(msg_id=msg_id, timestamp=at, data=body),
                "Content-Type": "application/json",
            },
            retries=False,
            redirect=False,
        )
        assert r.status == 204

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(post, bodies))
    return n / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument(
        "--profile", action="store_true", help="also count statements and time per phase"
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also measure events/delivery.py as at this git ref, alternating with today's",
    )
    args = parser.parse_args(argv)
    report = Report()
    ports: multiprocessing.Queue = multiprocessing.Queue()
    receiver = multiprocessing.Process(target=_serve, args=(ports,), daemon=True)
    receiver.start()
    url = f"http://127.0.0.1:{ports.get(timeout=10)}/hooks"
    try:
        with bench_stack(
            redis=False, localstripe=False, extra_env={"WEBHOOK_ALLOW_LOOPBACK": "true"}
        ):
            from django.conf import settings

            threads = settings.WEBHOOK_SEND_THREADS
            old = baseline_module(args.baseline) if args.baseline else None
            verity, floor, before = [], [], []
            for run in range(args.runs):
                log(f"run {run + 1}/{args.runs}: floor (bare signed POSTs)")
                floor.append(run_floor(args.events, url, threads, f"f{run}"))
                if old is not None:
                    log(f"run {run + 1}/{args.runs}: events.delivery at {args.baseline}")
                    before.append(run_verity(args.events, url, threads, f"b{run}", old))
                log(f"run {run + 1}/{args.runs}: events.delivery")
                verity.append(run_verity(args.events, url, threads, f"v{run}"))
            if args.profile:
                log("profile: statements and time per phase")
                prof = run_profile(args.events, url, threads, "p")
    finally:
        receiver.terminate()
    v, f = med(verity), med(floor)
    report.add(
        "webhook delivery",
        "events/s to a local receiver",
        fmt(v),
        fmt(f),
        ratio(v, f),
        "",
        f"{args.events} events, {threads} threads, {args.runs} runs, median; floor "
        "= signed POSTs over kept-alive connections, no database",
    )
    if before:
        b = med(before)
        report.add(
            "webhook delivery",
            f"events/s, events.delivery at {args.baseline}",
            fmt(b),
            fmt(f),
            ratio(b, f),
            "",
            f"the same runs, alternating; today / {args.baseline} = {v / b:.2f}",
        )
    if args.profile:
        per = prof["statements"] / max(1, prof["events"])
        phases = ", ".join(
            f"{name.strip('_')} {1000 * sec / max(1, prof['events']):.2f} ms"
            for name, sec in prof["phases"].items()
        )
        report.add(
            "webhook delivery",
            "SQL statements per delivered event",
            f"{per:.2f}",
            "",
            "",
            "",
            f"{prof['events']} events in {prof['seconds']:.2f} s; per event: {phases}",
        )
    report.dump(args.json)
    report.print("webhook delivery")
    return report


if __name__ == "__main__":
    main()
