"""Chaos soak: every operation kind, people in the loop, every fault, then invariants.

    python bench/soak.py [--seconds 600] [--agents 100] [--seed 7] [--drain 180]
                         [--outage 30,60] [--out var/soak] [--quiet] [--x402|--no-x402]
    make soak SOAK_ARGS="--seconds 120 --agents 30"

Starts on loopback: throwaway PostgreSQL, Redis and localstripe (tests.stack), a fault
proxy in front of localstripe (bench/fault_proxy.py), gunicorn (3 workers x 8 threads),
two Celery workers and one beat.

Workload (careless agents, seeded): automatic and manual-capture payments with retries
on the same key, new keys and varied amounts, declines and deliberate retries; captures
and voids of authorizations; full and partial refunds (small ones automatic, larger ones
approved console-style by a finance user in this process); manual resolutions of unknown
operations by a resolver API client, sometimes wrong; workflow and step halts set and
cleared; signed provider events delivered late, twice and out of order; refunds made in
the provider's dashboard and disputes opened, won and lost there (known to Verity only by
their signed events); finance declining some refunds; and a seeded share of provider
requests drilled (payments/providers fault drills).

With --x402 (the default when Node/npm and tools/chain/node_modules are present) the stack
also runs anvil with Circle's token and the SDK's facilitator, behind a second fault proxy;
a seeded share of agents (--x402-share) buy a digital report over x402 (402 ->
PAYMENT-SIGNATURE signed with the SDK's client by a payer the chain launcher funded),
careless like the others; a share of the facilitator's answers (--x402-drop-rate) is
dropped after the settle was forwarded, and `facilitator_outage` refuses its connections.

Faults, each at a random moment and logged with its time: PostgreSQL restarted
(`pg_ctl restart -m immediate`), a gunicorn worker SIGKILLed mid-request (while provider
answers are held back, so some die between the provider call and recording its answer),
the provider unreachable for 30-60 s (connections refused), Redis stopped, Celery workers
SIGKILLed. Every kind happens at least once.

Invariants (bench/invariants.py) are checked every 30 s during the run and after a drain
with faults off. Output: a progress line (stderr), then the per-endpoint table, the faults
table, the invariant table; a chart (SVG) and the figures (JSON) in --out. Exits non-zero
on any violation or any 5xx other than a 503 with Retry-After while the database is down
(or `workflow_halted` while a halt is set).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fault_proxy import FaultProxy  # noqa: E402
from bench.soak_report import Recorder, endpoint_of  # noqa: E402
from bench.storefront_receivers import StorefrontReceiver, judge  # noqa: E402
from tests.stack import Stack, _as_pg_user, _wait_port, free_port  # noqa: E402
from tools.progress import Progress, fmt_duration  # noqa: E402

SECRET = "whsec_soak"
# localstripe knows one working token (pm_card_mastercard is a 404 there: failed invalid_request)
CARDS_OK = ["pm_card_visa"]
CARD_DECLINE = "pm_card_chargeCustomerFail"
AUTO_REFUND_LIMIT = 1000  # refunds up to this are automatic; larger ones wait for approval
FAULT_KINDS = (
    "pg_restart",
    "web_kill",
    "provider_outage",
    "redis_restart",
    "worker_sigkill",
    "halt",
)
X402_FAULT_KINDS = ("facilitator_outage",)  # with --x402: the facilitator refuses connections
CHECK_EVERY_SECONDS = 30
X402_SKU = "SOAK-REPORT"  # the x402 agents' digital good


class Services:
    """The production-shaped processes, restartable (with or without chaos)."""

    def __init__(self, stack: Stack, env: dict, logdir: Path) -> None:
        self.stack, self.env, self.logdir = stack, env, logdir
        self.web_port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopped: list[tuple[str, float]] = []  # each process, s after its stop began

    def _spawn(self, name: str, cmd: list[str], env: dict) -> None:
        log = open(self.logdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start(self, *, chaos: bool) -> None:
        env = dict(self.env)
        if not chaos:
            env["FAULT_DRILL_RANDOM_RATE"] = "0"
        py = sys.executable
        self._spawn(
            "web",
            [
                py,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "--bind",
                f"127.0.0.1:{self.web_port}",
                "--workers",
                "3",
                "--threads",
                "8",
                "--timeout",
                "30",
                "--backlog",
                "2048",
            ],
            env,
        )
        for i in (1, 2):
            self._spawn(f"worker{i}", self._worker_cmd(i), env)
        self._spawn(
            "beat",
            [
                py,
                "-m",
                "celery",
                "-A",
                "config",
                "beat",
                "--loglevel",
                "WARNING",
                "--schedule",
                str(self.logdir / "beat-schedule"),
            ],
            env,
        )
        self.env_used = env
        _wait_port(self.web_port, timeout=60, proc=self.procs["web"])
        # Every worker booted and connected before anyone is timed.
        deadline = time.monotonic() + 120
        ok = 0
        while ok < 6 and time.monotonic() < deadline:
            try:
                ok += (
                    requests.get(f"http://127.0.0.1:{self.web_port}/readyz", timeout=5).status_code
                    == 200
                )
            except requests.RequestException:
                time.sleep(0.5)

    def _worker_cmd(self, i: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--loglevel",
            "WARNING",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "-n",
            f"soak{i}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]

    def kill_worker(self, rng: random.Random) -> str:
        name = rng.choice(["worker1", "worker2"])
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._spawn(name, self._worker_cmd(int(name[-1])), self.env_used)
        return name

    def web_workers(self) -> list[int]:
        """pids of gunicorn's worker processes (the master's children)."""
        master = self.procs["web"].pid
        try:
            children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        except OSError:
            return []
        return [int(c) for c in children]

    def stop(self) -> None:
        t0 = time.monotonic()
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                # One deadline for all: a Celery worker whose thread hangs on a drilled
                # provider call (`hang_after_send`) never finishes its warm shutdown, and 15 s
                # each only delayed the drain.
                proc.wait(max(0.1, t0 + 5 - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                name += " (killed)"
            self.stopped.append((name, round(time.monotonic() - t0, 1)))
        self.procs.clear()


def restart_redis(stack: Stack, down_seconds: float) -> None:
    proc = stack.redis_proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(down_seconds)
    stack.procs.remove(proc)
    stack.redis_proc = stack._spawn(
        [
            "redis-server",
            "--port",
            str(stack.redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(stack.tmp),
        ],
        stack.redis_port,
    )


def restart_postgres(stack: Stack) -> None:
    """Crash-stop and start again with the same options (postmaster.opts)."""
    subprocess.run(
        _as_pg_user(
            [
                "pg_ctl",
                "-D",
                str(stack.pgdata),
                "-m",
                "immediate",
                "-w",
                "-t",
                "60",
                "-l",
                str(stack.tmp / "pg.log"),
                "restart",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Api:
    """One HTTP identity (an agent, the resolver); every request is recorded."""

    def __init__(self, base: str, key: str | None, rec: Recorder) -> None:
        self.base, self.rec = base, rec
        self.s = requests.Session()
        if key:
            self.s.headers["Authorization"] = f"Api-Key {key}"

    def call(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        *,
        key: str | None = None,
        timeout: float = 10,
        headers: dict | None = None,
        raw: bytes | None = None,
    ):
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if key:
            hdrs["Idempotency-Key"] = key
        endpoint = endpoint_of(method, path)
        with self.rec.lock:
            self.rec.inflight += 1
        t = time.monotonic()
        try:
            r = self.s.request(
                method,
                self.base + path,
                timeout=timeout,
                headers=hdrs,
                data=raw if raw is not None else (json.dumps(body) if body is not None else None),
            )
        except requests.Timeout:
            self.rec.record(endpoint, "timeout", (time.monotonic() - t) * 1000)
            return None
        except requests.RequestException:
            self.rec.record(endpoint, "no_answer", (time.monotonic() - t) * 1000)
            return None
        finally:
            with self.rec.lock:
                self.rec.inflight -= 1
        code = ""
        if r.status_code >= 500:
            try:
                code = r.json().get("code", "")
            except ValueError:
                code = "not_json"
            if "Retry-After" not in r.headers:
                code = f"{code} (no Retry-After)"
        self.rec.record(endpoint, str(r.status_code), (time.monotonic() - t) * 1000, code)
        return r


def _json(r) -> dict:
    try:
        return r.json() if r is not None else {}
    except ValueError:
        return {}


class Agent(threading.Thread):
    """A careless storefront agent: times out, retries with the same key, with new keys,
    varies the body, opens second purchases; pays, captures, voids and refunds."""

    def __init__(self, n: int, api: Api, skus: list[str], deadline: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.rng = random.Random(seed * 1000 + n)
        self.api, self.deadline, self.skus = api, deadline, skus
        self.rec = api.rec
        self.customers = [f"soak-cust-{seed}-{n}-{i}" for i in range(3)]

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            try:
                self.journey()
            except Exception as exc:  # keep driving; the checker judges the system
                self.rec.count(f"agent_error_{type(exc).__name__}")
                time.sleep(1)

    def post(self, path: str, body: dict, key: str, timeout: float = 10):
        return self.api.call("POST", path, body, key=key, timeout=timeout)

    def journey(self) -> None:
        rng = self.rng
        plan = rng.choices(["pay", "manual", "refund"], weights=[45, 30, 25])[0]
        items = [{"sku": rng.choice(self.skus), "quantity": rng.randint(1, 2)}]
        q = self.post("/api/v1/quotes", {"items": items, "currency": "usd"}, uuid.uuid4().hex)
        if q is None or q.status_code not in (200, 201):
            return self.pause()
        quote = q.json()
        customer = rng.choice(self.customers)
        body = {
            "quote_id": quote["id"],
            "quote_version": quote["version"],
            "customer": {"reference": customer, "email": f"{customer}@example.com"},
        }
        p = self.post("/api/v1/purchases", body, uuid.uuid4().hex)
        if p is not None and p.status_code == 409 and rng.random() < 0.5:
            unresolved = _json(p).get("unresolved") or [_json(p).get("purchase")]
            body["acknowledge_unresolved"] = [u for u in unresolved if u]
            self.rec.count("second_purchase_acknowledged")
            p = self.post("/api/v1/purchases", body, uuid.uuid4().hex)
        if p is None or p.status_code not in (200, 201):
            return self.pause()
        purchase = p.json()
        self.rec.count("purchases")
        op = self.pay(purchase, capture="manual" if plan == "manual" else "automatic")
        if op is None:
            return
        op = self.settle(op)
        if op.get("outcome") != "succeeded":
            return
        self.rec.count("authorizations" if plan == "manual" else "charges")
        if plan == "manual":
            action = "capture" if rng.random() < 0.7 else "void"
            self.linked(purchase["id"], action, {})
        elif plan == "refund":
            self.refunds(purchase)
        if rng.random() < 0.3:
            self.api.call("GET", f"/api/v1/purchases/{purchase['id']}")

    def pause(self) -> None:
        time.sleep(self.rng.uniform(0.5, 2))

    def pay(self, purchase: dict, *, capture: str) -> dict | None:
        rng = self.rng
        pay_path = f"/api/v1/purchases/{purchase['id']}/payments"
        card = CARD_DECLINE if rng.random() < 0.1 else rng.choice(CARDS_OK)
        pay = {"payment_method": card, "capture": capture}
        key = uuid.uuid4().hex
        last = None
        for _ in range(rng.randint(1, 5)):
            r = self.post(pay_path, pay, key, rng.choice([0.3, 1.0, 5.0, 15.0]))
            roll = rng.random()
            if r is not None and r.status_code == 402:
                op = _json(r).get("operation")
                if op and rng.random() < 0.5:
                    pay = {
                        "payment_method": rng.choice(CARDS_OK),
                        "capture": capture,
                        "retry_of": op,
                    }
                    key = uuid.uuid4().hex
                    self.rec.count("retry_after_decline")
                    continue
                return None
            if r is not None and r.status_code in (200, 201, 202):
                last = _json(r)
                if roll < 0.7:
                    return last
            if r is not None and r.status_code == 503:
                time.sleep(float(r.headers.get("Retry-After", "1")))
                self.rec.count("retry_after_503")
                continue
            # Careless retries: same key, a fresh key, or a varied body.
            if roll < 0.5:
                self.rec.count("retry_same_key")
            elif roll < 0.8:
                key = uuid.uuid4().hex
                self.rec.count("retry_new_key")
            else:
                key = uuid.uuid4().hex
                pay = dict(pay, amount=purchase["amount"] + rng.randint(1, 500))
                self.rec.count("retry_varied_amount")
            time.sleep(rng.random() * 0.5)
        return last

    def settle(self, op: dict, waits: int = 6) -> dict:
        """Poll an operation that is not settled yet, a few times."""
        for _ in range(waits):
            if op.get("outcome") in ("succeeded", "failed") or not op.get("id"):
                return op
            time.sleep(1 + self.rng.random())
            r = self.api.call("GET", f"/api/v1/operations/{op['id']}")
            if r is not None and r.status_code == 200:
                op = r.json()
        return op

    def linked(self, purchase_id: str, action: str, body: dict) -> dict | None:
        key = uuid.uuid4().hex
        for _ in range(self.rng.randint(1, 3)):  # sometimes the same request again
            r = self.post(
                f"/api/v1/purchases/{purchase_id}/{action}",
                body,
                key,
                self.rng.choice([1.0, 5.0, 15.0]),
            )
            if r is not None and r.status_code == 503:
                time.sleep(float(r.headers.get("Retry-After", "1")))
                continue
            if r is not None and r.status_code in (200, 201, 202):
                self.rec.count(f"{action}_requested")
                if self.rng.random() < 0.7:
                    return _json(r)
        return None

    def refunds(self, purchase: dict) -> None:
        rng = self.rng
        amount = purchase["amount"]
        if rng.random() < 0.5:
            self.linked(purchase["id"], "refunds", {})  # everything refundable
            return
        first = rng.randint(1, max(1, amount // 2))
        op = self.linked(purchase["id"], "refunds", {"amount": first})
        if op and rng.random() < 0.5:
            self.settle(op, waits=3)
            self.linked(
                purchase["id"],
                "refunds",
                {"amount": rng.randint(1, amount - first) if amount - first >= 1 else 1},
            )


class X402Agent(Agent):
    """A careless agent that buys a report over x402 (docs/x402.md): GET the deliverable,
    402 -> sign PAYMENT-REQUIRED with the SDK's EVM client (a payer funded by the chain
    launcher) -> GET again with PAYMENT-SIGNATURE. Times out early, repeats the same
    signature, sometimes signs a second, different authorization for the same purchase,
    and signs a new one after a failure."""

    def __init__(self, n: int, api: Api, sku: str, deadline: float, seed: int, payer) -> None:
        super().__init__(n, api, [sku], deadline, seed)
        self.payer = payer

    def journey(self) -> None:
        from tests.x402.chain import sign

        rng = self.rng
        q = self.post(
            "/api/v1/quotes",
            {"items": [{"sku": self.skus[0], "quantity": 1}], "currency": "usd"},
            uuid.uuid4().hex,
        )
        if q is None or q.status_code not in (200, 201):
            return self.pause()
        quote = q.json()
        customer = rng.choice(self.customers)
        p = self.post(
            "/api/v1/purchases",
            {
                "quote_id": quote["id"],
                "quote_version": quote["version"],
                "customer": {"reference": customer, "email": f"{customer}@example.com"},
            },
            uuid.uuid4().hex,
        )
        if p is None or p.status_code not in (200, 201):
            return self.pause()
        url = f"/api/v1/purchases/{p.json()['id']}/deliverable"
        self.rec.count("x402_purchases")
        r = self.api.call("GET", url)
        required = r.headers.get("PAYMENT-REQUIRED") if r is not None else None
        if r is None or r.status_code != 402 or not required:
            return self.pause()
        header, _auth = sign(required, self.payer)
        self.rec.count("x402_signed")
        for _ in range(rng.randint(1, 5)):
            r = self.api.call(
                "GET",
                url,
                headers={"PAYMENT-SIGNATURE": header},
                timeout=rng.choice([0.3, 1.0, 5.0, 15.0]),
            )
            body = _json(r)
            if r is not None and r.status_code == 200:
                self.rec.count("x402_delivered")
                if rng.random() < 0.7:
                    return
                self.rec.count("x402_repeat_after_delivery")
                continue
            if r is not None and r.status_code == 402 and r.headers.get("PAYMENT-REQUIRED"):
                # Failed, nothing charged: a new authorization is the way on (sometimes).
                if rng.random() < 0.5:
                    return
                header, _auth = sign(r.headers["PAYMENT-REQUIRED"], self.payer)
                self.rec.count("x402_new_authorization_after_failure")
                continue
            if r is not None and r.status_code == 409:
                self.rec.count(f"x402_refused_{body.get('code', '409')}")
                if body.get("code") == "already_paid":
                    return
            if r is not None and r.status_code in (202, 503):
                time.sleep(min(5.0, float(r.headers.get("Retry-After", "1"))))
            roll = rng.random()
            if roll < 0.2:
                # Careless: a second, different authorization for the same purchase.
                header, _auth = sign(required, self.payer)
                self.rec.count("x402_second_authorization")
            else:
                self.rec.count("x402_same_signature_again")
            time.sleep(rng.random() * 0.5)
        if rng.random() < 0.5:
            self.api.call("GET", url)  # where is it now (no payment attached)


class People(threading.Thread):
    """A finance user approving refunds (console-style, in this process) and a resolver
    settling unknown operations through the API — sometimes wrongly."""

    def __init__(
        self,
        resolver: Api,
        provider_base: str,
        deadline: float,
        rng: random.Random,
        rec: Recorder,
        wrong_rate: float,
    ) -> None:
        super().__init__(daemon=True)
        self.resolver, self.deadline, self.rng, self.rec = resolver, deadline, rng, rec
        self.base, self.wrong_rate = provider_base, wrong_rate

    def run(self) -> None:
        from django.db import connection

        while time.monotonic() < self.deadline:
            time.sleep(self.rng.uniform(2, 5))
            try:
                self.approve()
                self.resolve()
            except Exception as exc:  # the database may be restarting: try again later
                self.rec.count(f"people_error_{type(exc).__name__}")
                connection.close()

    def approve(self) -> None:
        from django.contrib.auth.models import User

        from payments import services
        from payments.enums import Outcome
        from payments.models import PaymentOperation

        finance = User.objects.get(username="soak-finance")
        waiting = list(
            PaymentOperation.objects.filter(outcome=Outcome.AWAITING_APPROVAL).values_list(
                "id", flat=True
            )[:10]
        )
        for op_id in waiting:
            try:
                if self.rng.random() < 0.25:  # finance says no to some
                    services.refund_decline(
                        operation_id=op_id,
                        acting_user=finance,
                        actor=finance.username,
                        reason="soak: finance declined",
                    )
                    self.rec.count("refund_declined")
                    continue
                services.refund_approve(
                    operation_id=op_id, acting_user=finance, reason="soak: finance approval"
                )
                self.rec.count("refund_approved")
            except services.DomainError as exc:
                self.rec.count(f"approve_refused_{exc.code}")

    def resolve(self) -> None:
        from datetime import timedelta

        from django.utils import timezone

        from payments.enums import PAYMENT_KINDS, Outcome, Rail
        from payments.models import PaymentOperation

        old = timezone.now() - timedelta(seconds=15)
        # The resolver reads the card provider's dashboard: card payments only (x402 ones
        # are the chain's to settle).
        ops = list(
            PaymentOperation.objects.filter(
                outcome=Outcome.UNKNOWN,
                created_at__lt=old,
                kind__in=PAYMENT_KINDS,
                rail=Rail.STRIPE,
            ).order_by("?")[:2]
        )
        for op in ops:
            # The person looks at the provider's dashboard first (and sometimes misreads it).
            truth = "failed"
            if op.provider_reference:
                try:
                    status = (
                        requests.get(
                            f"{self.base}/v1/payment_intents/{op.provider_reference}",
                            auth=("sk_test_verity_stack", ""),
                            timeout=10,
                        )
                        .json()
                        .get("status")
                    )
                except (requests.RequestException, ValueError):
                    continue
                truth = "succeeded" if status in ("succeeded", "requires_capture") else "failed"
            wrong = self.rng.random() < self.wrong_rate
            outcome = {"succeeded": "failed", "failed": "succeeded"}[truth] if wrong else truth
            r = self.resolver.call(
                "POST",
                f"/api/v1/operations/{op.id}/resolve",
                {
                    "outcome": outcome,
                    "reason": "soak: resolver checked the "
                    "provider dashboard" + (" (wrongly)" if wrong else ""),
                },
                key=uuid.uuid4().hex,
            )
            if r is not None and r.status_code == 200:
                self.rec.count("resolved_wrongly" if wrong else "resolved")
            elif r is not None:
                self.rec.count(f"resolve_refused_{_json(r).get('code', r.status_code)}")


class Events(threading.Thread):
    """Signed provider events built from localstripe's real objects, delivered late, twice
    and out of order (an older state after a newer one)."""

    TYPES = {
        "succeeded": "payment_intent.succeeded",
        "requires_capture": "payment_intent.amount_capturable_updated",
        "canceled": "payment_intent.canceled",
        "requires_payment_method": "payment_intent.payment_failed",
        "processing": "payment_intent.processing",
    }

    def __init__(
        self, web: Api, provider_base: str, deadline: float, rng: random.Random, rec: Recorder
    ) -> None:
        super().__init__(daemon=True)
        self.web, self.base, self.deadline, self.rng, self.rec = (
            web,
            provider_base,
            deadline,
            rng,
            rec,
        )
        self.late: list[tuple[float, bytes]] = []

    def recent_intent(self) -> dict | None:
        """One of the latest payments' PaymentIntents, as the provider has it now."""
        from payments.enums import PAYMENT_KINDS, Rail
        from payments.models import PaymentOperation

        refs = list(
            PaymentOperation.objects.filter(kind__in=PAYMENT_KINDS, rail=Rail.STRIPE)
            .exclude(provider_reference="")
            .order_by("-created_at")
            .values_list("provider_reference", flat=True)[:50]
        )
        if not refs:
            return None
        r = requests.get(
            f"{self.base}/v1/payment_intents/{self.rng.choice(refs)}",
            auth=("sk_test_verity_stack", ""),
            timeout=10,
        )
        return r.json() if r.status_code == 200 else None

    def deliver(self, body: bytes) -> None:
        ts = int(time.time())
        sig = hmac.new(SECRET.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
        self.web.call(
            "POST", "/webhooks/stripe/", raw=body, headers={"Stripe-Signature": f"t={ts},v1={sig}"}
        )

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            time.sleep(self.rng.uniform(0.5, 1.5))
            now = time.monotonic()
            due = [b for t, b in self.late if t <= now]
            self.late = [(t, b) for t, b in self.late if t > now]
            for body in due:
                self.deliver(body)
                self.rec.count("event_late")
            try:
                pi = self.recent_intent()
            except Exception:  # the database restarting, the provider away: next round
                from django.db import connection

                connection.close()
                continue
            if pi is None:
                continue
            status = pi["status"]
            if (
                pi["status"] == "succeeded"
                and pi.get("capture_method") == "manual"
                and self.rng.random() < 0.5
            ):
                status = "requires_capture"  # out of order: the state before the capture
                self.rec.count("event_out_of_order")
            if status not in self.TYPES:
                continue
            obj = dict(pi, status=status)
            body = json.dumps(
                {
                    "id": f"evt_soak_{uuid.uuid4().hex[:20]}",
                    "object": "event",
                    "api_version": "2024-06-20",
                    "created": int(time.time()),
                    "livemode": False,
                    "type": self.TYPES[status],
                    "data": {"object": obj},
                }
            ).encode()
            roll = self.rng.random()
            if roll < 0.4:
                self.late.append((now + self.rng.uniform(10, 40), body))
            else:
                self.deliver(body)
                if roll < 0.7:
                    self.deliver(body)
                    self.rec.count("event_twice")
                else:
                    self.rec.count("event_once")


class ProviderDesk(Events):
    """People working in the provider's dashboard, not through Verity: a partial refund
    made there, and a card network's dispute opened on a charge (later won or lost). Each
    reaches Verity only as a signed event built from the provider's own object (sometimes
    late or twice), exactly as Stripe would send it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.disputed: set[str] = set()
        self.open_disputes: list[tuple[float, str]] = []
        # A dashboard refund whose answer the desk lost (a timeout) may still have been
        # made, and Stripe announces every refund it makes: its PaymentIntent is read again
        # until each refund made there is announced (`announce_lost`).
        self.answer_lost: set[str] = set()
        self.announced: set[str] = set()

    def deliver(self, body: bytes) -> None:
        """As the provider does: an event not acknowledged with a 2xx (a web worker killed,
        the database restarting, a timeout) is sent again later."""
        ts = int(time.time())
        sig = hmac.new(SECRET.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
        r = self.web.call(
            "POST", "/webhooks/stripe/", raw=body, headers={"Stripe-Signature": f"t={ts},v1={sig}"}
        )
        if r is None or not 200 <= r.status_code < 300:
            self.late.append((time.monotonic() + self.rng.uniform(5, 15), body))
            self.rec.count("desk_event_redelivered")

    def provider(self, method: str, path: str, **data) -> dict | None:
        r = requests.request(
            method, f"{self.base}{path}", data=data, auth=("sk_test_verity_stack", ""), timeout=10
        )
        return r.json() if r.status_code == 200 else None

    def event(self, obj: dict, type_: str) -> None:
        body = json.dumps(
            {
                "id": f"evt_desk_{uuid.uuid4().hex[:20]}",
                "object": "event",
                "api_version": "2024-06-20",
                "created": int(time.time()),
                "livemode": False,
                "type": type_,
                "data": {"object": obj},
            }
        ).encode()
        roll = self.rng.random()
        if roll < 0.3:
            self.late.append((time.monotonic() + self.rng.uniform(5, 20), body))
        else:
            self.deliver(body)
            if roll < 0.5:
                self.deliver(body)

    def refunded_at_provider(self, intent_id: str) -> int:
        listed = self.provider("GET", f"/v1/refunds?payment_intent={intent_id}&limit=100")
        return sum(
            r["amount"] for r in (listed or {}).get("data", []) if r.get("status") != "failed"
        )

    def charged_intent(self) -> dict | None:
        from payments.enums import OperationKind, Outcome, Rail
        from payments.models import PaymentOperation

        refs = list(
            PaymentOperation.objects.filter(
                kind=OperationKind.CHARGE,
                outcome=Outcome.SUCCEEDED,
                rail=Rail.STRIPE,
                is_duplicate=False,
            )
            .exclude(provider_reference="")
            .order_by("-created_at")
            .values_list("provider_reference", flat=True)[:40]
        )
        if not refs:
            return None
        pi = self.provider("GET", f"/v1/payment_intents/{self.rng.choice(refs)}")
        return pi if pi and pi.get("status") == "succeeded" else None

    def run(self) -> None:
        from django.db import connection

        while time.monotonic() < self.deadline:
            time.sleep(self.rng.uniform(4, 8))
            now = time.monotonic()
            due = [b for t, b in self.late if t <= now]
            self.late = [(t, b) for t, b in self.late if t > now]
            for body in due:
                self.deliver(body)
            try:
                self.announce_lost()
                self.close_due(now)
                self.act(now)
            except Exception as exc:  # the database restarting, the provider away: next
                self.rec.count(f"desk_error_{type(exc).__name__}")
                connection.close()
        for _ in range(20):
            try:
                self.announce_lost()
                break
            except requests.RequestException:
                time.sleep(3)
        # The provider retries undelivered events for days: the late ones arrive in the end.
        for _ in range(20):
            pending, self.late = self.late, []
            for _, body in pending:
                self.deliver(body)
            if not self.late:
                break
            time.sleep(3)

    def act(self, now: float) -> None:
        pi = self.charged_intent()
        if pi is not None:
            charge = pi.get("latest_charge") or ((pi.get("charges") or {}).get("data") or [{}])[0]
            charge = charge.get("id") if isinstance(charge, dict) else charge  # embedded
            if self.rng.random() < 0.5 or not charge or charge in self.disputed:
                # A person in the dashboard refunds only what is left of the charge (Stripe
                # refuses more; localstripe does not check, so the desk must).
                left = pi["amount"] - self.refunded_at_provider(pi["id"])
                refund = None
                if left > 0:
                    self.answer_lost.add(pi["id"])  # until its answer names the refund
                    refund = self.provider(
                        "POST",
                        "/v1/refunds",
                        payment_intent=pi["id"],
                        amount=min(left, max(1, pi["amount"] // 10)),
                    )
                if refund is not None:
                    self.answer_lost.discard(pi["id"])
                    self.announced.add(refund["id"])
                    self.event(refund, "refund.created")
                    self.rec.count("provider_refund_outside_verity")
            else:
                dispute = self.provider("POST", "/_config/disputes", charge=charge)
                if dispute is not None:
                    self.disputed.add(charge)
                    self.event(dispute, "charge.dispute.created")
                    self.open_disputes.append((now + self.rng.uniform(10, 30), dispute["id"]))
                    self.rec.count("dispute_opened")

    def announce_lost(self) -> None:
        """The refunds made at the desk whose answer was lost: each one the provider shows
        (no Verity `operation_id` in its metadata) is announced once, as Stripe would."""
        for intent_id in sorted(self.answer_lost):
            listed = self.provider("GET", f"/v1/refunds?payment_intent={intent_id}&limit=100")
            if listed is None:
                continue
            for refund in listed.get("data", []):
                outside = not (refund.get("metadata") or {}).get("operation_id")
                if outside and refund["id"] not in self.announced:
                    self.announced.add(refund["id"])
                    self.event(refund, "refund.created")
                    self.rec.count("provider_refund_outside_verity_answer_lost")
            self.answer_lost.discard(intent_id)

    def close_due(self, now: float) -> None:
        due = [d for t, d in self.open_disputes if t <= now]
        self.open_disputes = [(t, d) for t, d in self.open_disputes if t > now]
        for dispute_id in due:
            status = self.rng.choice(["won", "lost"])
            dispute = self.provider("POST", f"/_config/disputes/{dispute_id}", status=status)
            if dispute is not None:
                self.event(dispute, "charge.dispute.closed")
                self.rec.count(f"dispute_{status}")


def fault_plan(
    seconds: float, rng: random.Random, *, outage: tuple[float, float], x402: bool = False
) -> list:
    """(at, kind) for the run: every kind at least once, then random ones, spaced out.
    The first faults come in a fixed order so even a short run sees a database restart
    and a web kill early."""
    start, end = min(12.0, seconds * 0.15), seconds - max(8.0, outage[1] * 0.3)
    kinds = list(FAULT_KINDS) + (list(X402_FAULT_KINDS) if x402 else [])
    rest = kinds[2:]
    rng.shuffle(rest)
    kinds = kinds[:2] + rest
    gap = max(4.0, min(25.0, (end - start) / max(len(kinds), 1)))
    n_more = max(0, int((end - start) / gap) - len(kinds))
    more, weights = (
        ["worker_sigkill", "redis_restart", "web_kill", "pg_restart", "halt", "provider_outage"],
        [3, 2, 3, 2, 2, 1],
    )
    if x402:
        more, weights = more + list(X402_FAULT_KINDS), weights + [1]
    kinds += rng.choices(more, weights=weights, k=n_more)
    plan, t = [], start
    for kind in kinds:
        plan.append((t, kind))
        t += gap * rng.uniform(0.7, 1.3)
        if t > end:
            break
    return plan


def chaos(
    plan: list,
    services: Services,
    stack: Stack,
    proxy: FaultProxy,
    rec: Recorder,
    rng: random.Random,
    deadline: float,
    outage: tuple[float, float],
    progress: Progress,
    x402_proxy: FaultProxy | None = None,
) -> None:
    from django.db import connection

    outage_until = [0.0]

    def provider_outage(seconds: float) -> None:
        f = rec.fault("provider_outage", "connections to the provider refused", seconds)
        progress.note(f"[{f.t:6.1f}s] fault: provider unreachable for {seconds:.0f}s")
        proxy.down()
        time.sleep(seconds)
        proxy.up()

    for at, kind in plan:
        while rec.now() < at and time.monotonic() < deadline:
            time.sleep(0.2)
        if time.monotonic() >= deadline - 3:
            return
        t0 = time.monotonic()
        if kind == "pg_restart":
            w = rec.window_open("database_unavailable")
            restart_postgres(stack)
            rec.window_close(w)
            f = rec.fault(kind, "pg_ctl restart -m immediate", time.monotonic() - t0, at=t0)
            connection.close()
        elif kind == "web_kill":
            pids = services.web_workers()
            if not pids:
                continue
            proxy.hold(1.5)  # provider answers are late: kill between call and record
            if x402_proxy is not None:
                x402_proxy.hold(1.5)  # the facilitator's too: between settle and record
            time.sleep(0.8)
            victim = rng.choice(pids)
            inflight = rec.inflight
            os.kill(victim, signal.SIGKILL)
            proxy.hold(0)
            if x402_proxy is not None:
                x402_proxy.hold(0)
            f = rec.fault(
                kind,
                f"SIGKILL gunicorn worker {victim}, {inflight} requests in "
                "flight, provider answers held 1.5 s",
            )
        elif kind == "provider_outage":
            if time.monotonic() < outage_until[0]:
                continue
            seconds = rng.uniform(*outage)
            outage_until[0] = time.monotonic() + seconds + 5
            threading.Thread(target=provider_outage, args=(seconds,), daemon=True).start()
            continue
        elif kind == "facilitator_outage":
            if x402_proxy is None:
                continue
            seconds = rng.uniform(3, 8)
            x402_proxy.down()  # new settles refused (not sent), those in flight reset
            time.sleep(seconds)
            x402_proxy.up()
            f = rec.fault(kind, "connections to the x402 facilitator refused", seconds, at=t0)
        elif kind == "redis_restart":
            down = rng.uniform(1, 4)
            restart_redis(stack, down)
            f = rec.fault(kind, "redis-server SIGKILL, then started", time.monotonic() - t0, at=t0)
        elif kind == "worker_sigkill":
            f = rec.fault(kind, f"SIGKILL celery {services.kill_worker(rng)}")
        elif kind == "halt":
            from recovery.halts import halt_clear, halt_set

            name = rng.choice(["refunds", "step:crm", "step:confirmation", "step:order"])
            seconds = rng.uniform(5, 15)
            w = rec.window_open("workflow_halted")
            try:
                halt_set(name=name, reason="soak: operator pause", actor="soak-operator")
                time.sleep(seconds)
                halt_clear(name=name, actor="soak-operator", reason="soak: resumed")
            except Exception as exc:  # e.g. the database restarting: note and go on
                rec.count(f"halt_error_{type(exc).__name__}")
                connection.close()
            rec.window_close(w)
            f = rec.fault(kind, f"{name} set, then cleared", seconds, at=t0)
        else:
            continue
        progress.note(
            f"[{f.t:6.1f}s] fault: {f.kind} {f.detail}"
            + (f" ({f.seconds:.1f}s)" if f.seconds else "")
        )


def checker(rec: Recorder, deadline: float, progress: Progress, results: list) -> None:
    """Every 30 s: the invariants that must hold at every instant."""
    from django.db import connection

    from bench.invariants import check

    while time.monotonic() < deadline:
        time.sleep(CHECK_EVERY_SECONDS)
        try:
            rep = check(live=True)
        except Exception as exc:  # the database or provider may be restarting
            rec.count(f"check_skipped_{type(exc).__name__}")
            connection.close()
            continue
        results.append((round(rec.now(), 1), rep.violations))
        # Each violation with the rows under it (the purchases and operations it concerns).
        showing = False
        for name, value, rule in rep.rows:
            if rule.endswith("VIOLATION"):
                showing = True
                progress.note(
                    f"[{rec.now():6.1f}s] VIOLATION (live check): {name.strip()} = "
                    f"{value} ({rule.replace('<-- VIOLATION', '').strip()})"
                )
            elif showing and name.startswith("  "):
                progress.note(f"           {name.strip()} {value} {rule}")
            else:
                showing = False


def drain(seconds: float) -> tuple[float, dict[str, int]]:
    """Wait until no dispatch is open, the outbox is empty and paid purchases are done.
    Returns the time it took and what was last seen busy (empty when it drained)."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    start = time.monotonic()
    stable = 0
    busy: dict[str, int] = {}
    seen: list = []
    connection.close()  # opened before a database restart, perhaps
    while time.monotonic() - start < seconds:
        try:
            busy = {k: v for k, v in _busy(timezone, timedelta).items() if v}
        except Exception:  # noqa: BLE001 - the database came back; reconnect and go on
            busy = {"database unreachable": 1}
        stable = stable + 1 if not busy else 0
        if not seen or seen[-1][1] != busy:
            seen.append((round(time.monotonic() - start, 1), busy))
        if stable >= 5:
            break
        connection.close()
        time.sleep(2)
    DRAIN_SEEN[:] = seen
    return time.monotonic() - start, busy


DRAIN_SEEN: list = []  # what the last drain saw busy, as it changed


def _busy(timezone, timedelta) -> dict[str, int]:
    from collections import Counter

    from events.models import WebhookDelivery
    from payments.enums import Outcome
    from payments.models import PaymentOperation, Purchase
    from recovery.models import OutboxMessage, StepRun
    from recovery.orchestrator import FULFILLABLE_STATUSES
    from webhooks.models import EventResult, ProviderEvent

    # A step is due only while its purchase can be fulfilled (the statuses the
    # orchestrator runs steps in; a wait condition, not a judge): one whose money went
    # back (refunded, voided, a dispute lost), or is held (a dispute open, a person's
    # review), keeps its unrun steps pending for good or until the dispute closes.
    # Counting those, every short soak with one waited out its cap.
    steps = StepRun.objects.filter(
        state__in=["pending", "running"],
        purchase_id__in=Purchase.objects.filter(status__in=FULFILLABLE_STATUSES).values("id"),
    ).values_list("purchase_id", "step", "state")
    status = dict(
        Purchase.objects.filter(id__in={pid for pid, _, _ in steps}).values_list("id", "status")
    )
    steps_by_kind = Counter(
        f"steps {state} (step {step}, purchase {status.get(pid)})" for pid, step, state in steps
    )
    return {
        **steps_by_kind,
        # Every outbox row due now (an event that just arrived, the last one the provider
        # redelivered: found by the short soak in CI, checked before its row ran) and every
        # event not yet judged or held for a re-match.
        "operations dispatching or pending": PaymentOperation.objects.filter(
            outcome__in=[Outcome.DISPATCHING, Outcome.PENDING]
        ).count(),
        "outbox rows due": OutboxMessage.objects.filter(
            processed_at__isnull=True, available_at__lte=timezone.now()
        ).count(),
        "webhook deliveries pending": WebhookDelivery.objects.filter(state="pending").count(),
        "provider events pending or held": ProviderEvent.objects.filter(
            result__in=[EventResult.PENDING, EventResult.HELD]
        ).count(),
    }


def fulfilment_rows(started_wall) -> tuple[list, dict[str, list[float]]]:
    """Every paid purchase's paid / fulfilling / completed times (s since `started_wall`,
    the run's start on the wall clock) from its rows — `paid_at` and the first status
    transitions into `fulfilling` and `completed` — and each step's run times (s), for
    bench.soak_report.paid_to_completed."""
    from django.db.models import Min, OuterRef, Subquery

    from bench.soak_report import Fulfilment
    from payments.models import OperationTransition, Purchase
    from recovery.models import StepRun, StepState

    def entered(status: str):
        return Subquery(
            OperationTransition.objects.filter(
                purchase_id=OuterRef("pk"), field="status", operation__isnull=True, target=status
            )
            .values("purchase_id")
            .annotate(at=Min("created_at"))
            .values("at")
        )

    def since(at):
        return None if at is None else (at - started_wall).total_seconds()

    rows = [
        Fulfilment(since(paid), since(fulfilling), since(completed), status)
        for paid, fulfilling, completed, status in Purchase.objects.filter(paid_at__isnull=False)
        .annotate(fulfilling=entered("fulfilling"), completed=entered("completed"))
        .values_list("paid_at", "fulfilling", "completed", "status")
    ]
    steps: dict[str, list[float]] = {}
    for step, start, end in (
        StepRun.objects.filter(state=StepState.DONE, started_at__isnull=False)
        .exclude(completed_at__isnull=True)
        .order_by("id")
        .values_list("step", "started_at", "completed_at")
    ):
        steps.setdefault(step, []).append((end - start).total_seconds())
    return rows, steps


def payment_steps() -> dict[str, int]:
    """Provider write calls by step (`pay`: one round trip; `create`, `confirm`: two)."""
    from django.db.models import Count

    from payments.models import ProviderCall

    return dict(
        ProviderCall.objects.filter(purpose="dispatch")
        .values_list("step")
        .annotate(n=Count("id"))
        .order_by("step")
    )


def x402_available() -> bool:
    """Node/npm and the chain's npm packages (anvil, Circle's token artifacts) are here."""
    import shutil

    from tools import x402_chain

    return bool(
        shutil.which("node")
        and shutil.which("npm")
        and (x402_chain.CHAIN_TOOLS / "node_modules").is_dir()
        and x402_chain.available()
    )


def miner(stop: threading.Event) -> None:
    """The chain keeps making blocks (every 2 s), as a real one does: its clock moves, so
    an authorization nobody used is provably expired after validBefore."""
    from tests.x402.chain import Chain

    chain = Chain()
    while not stop.wait(2):
        try:
            chain.mine()
        except Exception:  # noqa: BLE001 - next block then
            pass


def mark(state: dict, phase: str) -> None:
    """End a phase of the run: its name and when it ended (monotonic), for the run's
    phase table (where a short soak spends its time besides driving)."""
    state["marks"].append((phase, time.monotonic()))


def phases(state: dict) -> dict[str, float]:
    marks = state["marks"]
    return {
        name: round(at - before, 1)
        for (_, before), (name, at) in zip(marks, marks[1:], strict=False)
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600, help="driving time (default 600)")
    ap.add_argument(
        "--agents",
        "--clients",
        dest="agents",
        type=int,
        default=100,
        help="concurrent agents (default 100)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--one-call",
        action="store_true",
        help="the provider dedupes keys (localstripe's idempotency layer on, "
        "STRIPE_DEDUPES_KEYS=true): every card payment is one round trip",
    )
    ap.add_argument(
        "--drain",
        type=float,
        default=900,
        help="at most this long for recovery to finish after driving (default 900; it ends "
        "once nothing is due: 100 agents on 2 cores leave 5-10 minutes of backlog, most "
        "of it storefront events, 63 000 deliveries sent at about 105 a second)",
    )
    ap.add_argument(
        "--fault-rate", type=float, default=0.15, help="share of provider requests drilled"
    )
    ap.add_argument("--outage", default="30,60", help="provider outage seconds: min,max")
    ap.add_argument(
        "--provider-desk",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="refunds and disputes made in the provider's dashboard (default on)",
    )
    ap.add_argument(
        "--wrong-resolutions",
        type=float,
        default=0.2,
        help="share of manual resolutions that are wrong",
    )
    ap.add_argument(
        "--out", default=str(ROOT / "var" / "soak"), help="directory for soak.svg and soak.json"
    )
    ap.add_argument("--quiet", action="store_true", help="no progress line")
    ap.add_argument(
        "--x402",
        action=argparse.BooleanOptionalAction,
        default=x402_available(),
        help="also start the chain and the x402 facilitator and pay x402 "
        "(default: on when Node/npm and tools/chain/node_modules are there)",
    )
    ap.add_argument(
        "--x402-share",
        type=float,
        default=0.2,
        help="share of agents that buy reports over x402 (default 0.2)",
    )
    ap.add_argument(
        "--x402-drop-rate",
        type=float,
        default=0.1,
        help="share of facilitator answers dropped after the settle was forwarded (default 0.1)",
    )
    args = ap.parse_args(argv)
    outage = tuple(float(x) for x in args.outage.split(","))
    rec = Recorder()
    state = {"phase": "starting", "checks": [], "planned": args.seconds, "marks": []}
    mark(state, "")

    db = {"at": 0.0, "purchases": 0, "charges": 0, "auths": 0, "refunds": 0}

    def db_counts() -> None:
        """Purchases and money movements so far, from the database (at most every 5 s;
        the last figures stand while it restarts)."""
        if state["phase"] == "starting" or time.monotonic() - db["at"] < 5:
            return
        db["at"] = time.monotonic()
        try:
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT (SELECT count(*) FROM payments_purchase), "
                    "count(*) FILTER (WHERE kind = 'charge'), "
                    "count(*) FILTER (WHERE kind = 'authorize'), "
                    "count(*) FILTER (WHERE kind = 'refund') "
                    "FROM payments_paymentoperation WHERE outcome = 'succeeded'"
                )
                db["purchases"], db["charges"], db["auths"], db["refunds"] = cursor.fetchone()
        except Exception:  # noqa: BLE001 - restarting: keep the last figures
            from django.db import connection

            connection.close()

    def status() -> str:
        db_counts()
        st, fl = rec.status_counts(), rec.fault_counts()
        checks = state["checks"]
        bad = sum(len(v) for _, v in checks)
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(st.items()))
        faults = " ".join(f"{k}:{v}" for k, v in sorted(fl.items())) or "none yet"
        if state["phase"] == "starting":
            return "starting the stack, migrating, booting gunicorn and Celery"
        return (
            f"{state['phase']} {fmt_duration(rec.now())}/{fmt_duration(state['planned'])}"
            f" | {args.agents} agents | purchases {db['purchases']}, succeeded: charges "
            f"{db['charges']} authorizations {db['auths']} refunds {db['refunds']}"
            f" | faults {faults} | answers {statuses}"
            f" | live checks {len(checks)} ({bad} violations)"
        )

    progress = Progress(status, label="soak", quiet=args.quiet)
    progress.start()
    try:
        return _run(args, outage, rec, state, progress)
    finally:
        progress.stop()


def _run(args, outage, rec: Recorder, state: dict, progress: Progress) -> int:
    # durable: PostgreSQL is crash-restarted below, and a commit acknowledged to a client
    # must survive that, as in production (synchronous_commit on).
    with Stack(x402=args.x402, durable=True) as stack:
        mark(state, "stack")
        logdir = stack.tmp / "soak-logs"
        logdir.mkdir()
        proxy = FaultProxy(stack.localstripe_port)
        proxy.up()
        x402_proxy, x402_env = None, {}
        if args.x402:
            # The facilitator behind its own fault proxy: outages refuse connections, a
            # seeded share of answers is dropped after the settle was forwarded.
            x402_proxy = FaultProxy(stack.x402_ports[1], seed=args.seed)
            x402_proxy.up()
            x402_proxy.drop_answers(args.x402_drop_rate)
            x402_env = {
                "X402_FACILITATOR_URL": x402_proxy.base,
                # an authorization nobody used expires (provably failed) in the drain
                "X402_MAX_TIMEOUT_SECONDS": "60",
                "X402_FACILITATOR_TIMEOUT": "5",
            }
        env = {
            **os.environ,
            **stack.env,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "STRIPE_API_BASE": proxy.base,  # the processes under test see the proxy
            "STRIPE_WEBHOOK_SECRETS": SECRET,
            "STRIPE_CONNECT_TIMEOUT": "2",
            "STRIPE_READ_TIMEOUT": "5",
            "DISPATCH_LEASE_SECONDS": "12",
            "RECONCILE_SCHEDULE_SECONDS": "2,4,8",
            "OUTBOX_SWEEP_SECONDS": "1",
            "API_THROTTLE_RATE": "1000000/min",
            "STEP_LEASE_SECONDS": "10",
            # A worker killed mid-send (a fault, or a warm shutdown that outlasts the stop's
            # 15 s) leaves its claimed deliveries leased: they go out again after this, not
            # after production's 60 s, which held every receiver's queue behind them for a
            # minute of the drain. A batch sends in seconds (1 s timeouts below); a lease
            # that lapses mid-send sends again, which the receivers dedupe and count.
            "WEBHOOK_LEASE_SECONDS": "15",
            "EMAIL_TIMEOUT": "5",
            "PAID_WITHOUT_ORDER_SECONDS": "5",
            "STALLED_FULFILMENT_SWEEP_SECONDS": "2",
            "RECONCILE_SWEEP_SECONDS": "1",
            "DEAD_DISPATCH_SWEEP_SECONDS": "2",
            "FAULT_DRILL_RANDOM_RATE": str(args.fault_rate),
            "FAULT_DRILL_RANDOM_SEED": str(args.seed),
            "CELERY_DB_REUSE_MAX": "1000",
            # storefront webhook receivers on loopback (bench/storefront_receivers.py):
            # a hung receiver is given up on after 1 s, retries come within seconds
            "WEBHOOK_ALLOW_LOOPBACK": "true",
            "WEBHOOK_CONNECT_TIMEOUT_SECONDS": "1",
            "WEBHOOK_READ_TIMEOUT_SECONDS": "1",
            "WEBHOOK_RETRY_SCHEDULE_SECONDS": "1,2,4",
            "WEBHOOK_SWEEP_SECONDS": "1",
            "STRIPE_DEDUPES_KEYS": "true" if args.one_call else "false",
            **x402_env,
        }
        if args.one_call:
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{stack.env['STRIPE_API_BASE']}/_config/idempotency", data=b"enabled=true"
                ),
                timeout=10,
            ).read()
        # This process checks and approves: it talks to the provider itself, not the proxy.
        os.environ.update(
            {
                **env,
                "STRIPE_API_BASE": stack.env["STRIPE_API_BASE"],
                **(
                    {"X402_FACILITATOR_URL": stack.env["X402_FACILITATOR_URL"]} if args.x402 else {}
                ),
            }
        )
        import django

        django.setup()
        # Migrated and given its API clients here, in this process: three `manage.py`
        # interpreters each spent seconds importing Django before doing the same.
        from io import StringIO

        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        mark(state, "migrate")

        def api_client(*options: str) -> str:
            said = StringIO()
            call_command("create_api_client", *options, stdout=said)
            return said.getvalue().strip().splitlines()[-1]  # its last line: the key alone

        key = api_client(
            "soak",
            "--scopes",
            "purchases:read",
            "purchases:write",
            "refunds:write",
            "webhooks:manage",
            "--limit",
            str(10**12),
            "--auto-refund-limit",
            str(AUTO_REFUND_LIMIT),
            # its journeys name earlier purchases in acknowledge_unresolved as a
            # storefront's own checkout would (docs/walkthrough.md#api-rules-the-code-relies-on)
            "--storefront-confirmation",
        )
        resolver_key = api_client(
            "soak-resolver", "--scopes", "purchases:read", "operations:resolve"
        )
        mark(state, "api clients")
        import logging

        logging.getLogger("x402").setLevel(logging.WARNING)  # the SDK logs every signature
        from django.contrib.auth.models import Group, User

        from payments.models import Product

        finance = User.objects.create_user("soak-finance", password=uuid.uuid4().hex)
        finance.groups.add(Group.objects.get_or_create(name="finance")[0])
        skus = []
        for i, price in enumerate([700, 1250, 1800, 2600]):
            Product.objects.get_or_create(
                sku=f"SOAK-{i}", defaults={"name": f"Soak item {i}", "price": price, "stock": 10**8}
            )
            skus.append(f"SOAK-{i}")
        if args.x402:  # a digital good: the x402 agents' report (the deliverable step)
            Product.objects.get_or_create(
                sku=X402_SKU,
                defaults={"name": "Soak report", "price": 900, "stock": 10**8, "kind": "digital"},
            )

        mark(state, "django set-up, products")
        services = Services(stack, env, logdir)
        try:
            return _drive(
                args,
                outage,
                rec,
                state,
                progress,
                stack,
                proxy,
                services,
                env,
                key,
                resolver_key,
                skus,
                logdir,
                x402_proxy,
            )
        finally:
            services.stop()  # also when something above failed: no process outlives the run


def _drive(
    args,
    outage,
    rec: Recorder,
    state: dict,
    progress: Progress,
    stack: Stack,
    proxy: FaultProxy,
    services: Services,
    env: dict,
    key: str,
    resolver_key: str,
    skus: list[str],
    logdir: Path,
    x402_proxy: FaultProxy | None = None,
) -> int:
    services.start(chaos=True)
    mark(state, "boot gunicorn, celery")
    base = f"http://127.0.0.1:{services.web_port}"
    requests.post(
        f"{stack.env['STRIPE_API_BASE']}/_config/webhooks/soak",
        data={"url": f"{base}/webhooks/stripe/", "secret": SECRET},
        timeout=10,
    ).raise_for_status()
    # The storefront's webhook receivers: one steady, one failing, one timing out.
    receivers = [
        StorefrontReceiver(kind, args.seed + i)
        for i, kind in enumerate(("steady", "failing", "hanging"))
    ]
    for receiver in receivers:
        receiver.register(Api(base, key, rec))
    rng = random.Random(args.seed)
    plan = fault_plan(args.seconds, rng, outage=outage, x402=x402_proxy is not None)
    rec.started = time.monotonic()
    deadline = rec.started + args.seconds
    state["phase"] = "driving"
    x402_agents: set[int] = set()
    mining = threading.Event()
    if x402_proxy is not None:
        from eth_account import Account

        payers = [Account.from_key(k) for k in stack.env["X402_PAYER_KEYS"].split(",")]
        x402_agents = set(
            random.Random(args.seed + 4).sample(
                range(args.agents), max(1, round(args.agents * args.x402_share))
            )
        )
        threading.Thread(target=miner, args=(mining,), daemon=True).start()
    threads = [
        X402Agent(n, Api(base, key, rec), X402_SKU, deadline, args.seed, payers[n % len(payers)])
        if n in x402_agents
        else Agent(n, Api(base, key, rec), skus, deadline, args.seed)
        for n in range(args.agents)
    ]
    threads += [
        People(
            Api(base, resolver_key, rec),
            stack.env["STRIPE_API_BASE"],
            deadline,
            random.Random(args.seed + 1),
            rec,
            args.wrong_resolutions,
        ),
        Events(
            Api(base, None, rec),
            stack.env["STRIPE_API_BASE"],
            deadline,
            random.Random(args.seed + 2),
            rec,
        ),
    ]
    if args.provider_desk:
        threads.append(
            ProviderDesk(
                Api(base, None, rec),
                stack.env["STRIPE_API_BASE"],
                deadline,
                random.Random(args.seed + 3),
                rec,
            )
        )
    side = [
        threading.Thread(
            target=chaos,
            args=(plan, services, stack, proxy, rec, rng, deadline, outage, progress, x402_proxy),
            daemon=True,
        ),
        threading.Thread(
            target=checker, args=(rec, deadline, progress, state["checks"]), daemon=True
        ),
    ]
    mark(state, "receivers, threads")
    for t in threads + side:
        t.start()
    for t in threads:
        t.join(timeout=max(0, deadline - time.monotonic()) + 90)
    mark(state, "drive, agents' last journeys")
    for t in side:
        t.join(timeout=max(0, deadline - time.monotonic()) + 90)
    mark(state, "last live check, last fault")
    drove = rec.now()
    if proxy._listener is None:  # an outage outlived the run
        proxy.up()
    proxy.hold(0)
    if x402_proxy is not None:
        if x402_proxy._listener is None:
            x402_proxy.up()
        x402_proxy.hold(0)
        x402_proxy.drop_answers(0)
        rec.count("x402_facilitator_answers_dropped", x402_proxy.dropped)

    # Drain without chaos: restart every process with faults off, let recovery run.
    state["phase"] = "draining"
    state["planned"] = drove + args.drain
    services.stop()
    mark(state, "stop")
    for receiver in receivers:
        receiver.chaos = False
    services.start(chaos=False)
    restarted = rec.now()
    mark(state, "restart without faults")
    drained, still_busy = drain(args.drain)
    mark(state, "drain")
    state["phase"] = "checking"
    from bench.invariants import check

    report = check()
    mark(state, "invariants")
    explained: list[str] = []
    if report.violations or any(v for _, v in state["checks"]):
        from bench.invariants import explain_payments

        explained = explain_payments(report)
    from datetime import timedelta

    from django.utils import timezone

    from bench.soak_report import paid_to_completed

    fulfilment_table, fulfilment = paid_to_completed(
        *fulfilment_rows(timezone.now() - timedelta(seconds=rec.now())),
        faults=rec.faults,
        drove=drove,
        restarted=restarted,
    )
    dispatched = payment_steps()
    receiver_rows, receiver_violations = judge(receivers)
    for receiver in receivers:
        receiver.close()
    mining.set()
    services.stop()
    mark(state, "figures, stop")
    bad_5xx = rec.disallowed_5xx()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    title = (
        f"Verity soak: {args.agents} agents, {drove:.0f} s, seed {args.seed} "
        f"(throughput and latency, faults marked)"
    )
    (out / "soak.svg").write_text(rec.chart_svg(title))
    (out / "soak.json").write_text(
        json.dumps(
            {
                "seconds": drove,
                "agents": args.agents,
                "seed": args.seed,
                "x402_agents": len(x402_agents),
                "card_payments": "one-call" if args.one_call else "two-step",
                "dispatch_calls_by_step": dispatched,
                "drained_seconds": drained,
                "drain_still_busy": still_busy,
                "phases_seconds": phases(state),
                "drain_seen": DRAIN_SEEN,
                "stopped": services.stopped,
                "paid_to_completed": fulfilment,
                "counters": dict(rec.counters),
                "answers": dict(rec.status_counts()),
                "faults": [f.__dict__ for f in rec.faults],
                "timeline": rec.timeline(),
                "live_checks": state["checks"],
                "invariants": report.rows,
                "webhook_receivers": receiver_rows,
                "violations": report.violations,
                "disallowed_5xx": bad_5xx[:200],
            },
            indent=1,
        )
    )
    progress.stop()

    print(
        f"\nsoak: {drove:.0f}s driving, {args.agents} agents "
        f"({len(x402_agents)} paying over x402), seed {args.seed}, "
        f"fault rate {args.fault_rate}, drained in {drained:.0f}s"
        + (
            " (still busy: " + ", ".join(f"{k} {v}" for k, v in still_busy.items()) + ")"
            if still_busy
            else ""
        )
    )
    print("phases: " + ", ".join(f"{k} {v:.0f}s" for k, v in phases(state).items()))
    print(
        "card payments: "
        + ("one round trip (--one-call)" if args.one_call else "create, then confirm")
        + "; provider writes by step: "
        + ", ".join(f"{k} {v}" for k, v in dispatched.items())
    )
    print("events: " + ", ".join(f"{k}={v}" for k, v in sorted(rec.counters.items())))
    print(f"\n== per endpoint ==\n{rec.endpoint_table()}")
    print(f"\n== faults ({len(rec.faults)}) ==\n{rec.fault_table()}")
    print(f"\n== paid -> completed (the downstream steps, from the rows) ==\n{fulfilment_table}")
    checks = state["checks"]
    print(
        f"\n== invariants: {len(checks)} live checks during the run "
        f"({sum(len(v) for _, v in checks)} violations), then after the drain =="
    )
    report.print()
    print("\n== storefront webhook receivers (their own record) ==")
    for row in receiver_rows:
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    if explained:
        (out / "explain.txt").write_text("\n".join(explained) + "\n")
        print("\n== the payments a money rule names (calls, transitions, provider) ==")
        print("\n".join(explained))
    subprocess.run(["rm", "-rf", str(out / "logs")], check=False)
    subprocess.run(["cp", "-r", str(logdir), str(out / "logs")], check=False)
    print(
        f"\nchart: {out / 'soak.svg'}; figures: {out / 'soak.json'}; process logs: {out / 'logs'}"
    )
    violations = list(report.violations)
    violations += [f"live check at {t}s: {v}" for t, vs in checks for v in vs]
    violations += receiver_violations
    violations += [f"5xx not allowed: {b}" for b in bad_5xx[:20]]
    if len(bad_5xx) > 20:
        violations.append(f"... and {len(bad_5xx) - 20} more 5xx answers")
    if violations:
        print(f"\n{len(violations)} VIOLATION(S); process logs in {out / 'logs'}")
        for v in violations:
            print("  - " + v)
        return 1
    print("\nno violations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
