"""Chaos soak: careless agents + provider faults + killed workers + Redis outages, then an
invariant check against localstripe. Not part of `make test` (a 60 s version is).

    python bench/soak.py [--seconds 600] [--clients 8] [--seed 7] [--drain 180]

Starts on loopback: throwaway PostgreSQL, Redis and localstripe (tests.stack), gunicorn
(2 workers), two Celery workers and one beat. Exits non-zero on any invariant violation.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.stack import Stack, _wait_port, free_port  # noqa: E402

SECRET = "whsec_soak"
CARDS_OK = ["pm_card_visa", "pm_card_mastercard"]
CARD_DECLINE = "pm_card_chargeCustomerFail"


class Services:
    """The production-shaped processes, restartable (with or without chaos)."""

    def __init__(self, stack: Stack, env: dict, logdir: Path) -> None:
        self.stack, self.env, self.logdir = stack, env, logdir
        self.web_port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}

    def _spawn(self, name: str, cmd: list[str], env: dict) -> None:
        log = open(self.logdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, *, chaos: bool) -> None:
        env = dict(self.env)
        if not chaos:
            env["FAULT_DRILL_RANDOM_RATE"] = "0"
        py = sys.executable
        self._spawn("web", [py, "-m", "gunicorn", "config.wsgi:application", "--bind",
                            f"127.0.0.1:{self.web_port}", "--workers", "2", "--threads", "8",
                            "--timeout", "30"], env)
        for i in (1, 2):
            self._spawn(f"worker{i}", self._worker_cmd(i), env)
        self._spawn("beat", [py, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                             "--schedule", str(self.logdir / "beat-schedule")], env)
        self.env_used = env
        _wait_port(self.web_port, timeout=60, proc=self.procs["web"])

    def _worker_cmd(self, i: int) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "WARNING",
                "--pool", "threads", "--concurrency", "4", "-n", f"soak{i}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]

    def kill_worker(self, rng: random.Random) -> str:
        name = rng.choice(["worker1", "worker2"])
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._spawn(name, self._worker_cmd(int(name[-1])), self.env_used)
        return name

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


def restart_redis(stack: Stack, down_seconds: float) -> None:
    proc = stack.redis_proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(down_seconds)
    stack.procs.remove(proc)
    stack.redis_proc = stack._spawn(
        ["redis-server", "--port", str(stack.redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(stack.tmp)], stack.redis_port)


class Agent(threading.Thread):
    """A careless storefront agent: times out, retries with the same key, with new keys,
    varies the body, opens second purchases."""

    def __init__(self, n: int, base: str, key: str, skus: list[str], deadline: float,
                 seed: int, stats: dict, lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.rng = random.Random(seed * 1000 + n)
        self.base, self.deadline, self.skus = base, deadline, skus
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"Api-Key {key}"
        self.stats, self.lock = stats, lock
        self.customers = [f"soak-cust-{seed}-{n}-{i}" for i in range(3)]

    def count(self, what: str) -> None:
        with self.lock:
            self.stats[what] = self.stats.get(what, 0) + 1

    def post(self, path: str, body: dict, key: str, timeout: float):
        try:
            r = self.s.post(self.base + path, data=json.dumps(body), timeout=timeout,
                            headers={"Idempotency-Key": key,
                                     "Content-Type": "application/json"})
        except requests.RequestException:
            self.count("client_timeouts")
            return None
        self.count(f"http_{r.status_code}")
        return r

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            try:
                self.journey()
            except Exception as exc:  # keep driving; the checker judges the system
                self.count(f"agent_error_{type(exc).__name__}")

    def journey(self) -> None:
        rng = self.rng
        items = [{"sku": rng.choice(self.skus), "quantity": rng.randint(1, 2)}]
        q = self.post("/api/v1/quotes", {"items": items, "currency": "usd"}, uuid.uuid4().hex, 10)
        if q is None or q.status_code not in (200, 201):
            return
        quote = q.json()
        customer = rng.choice(self.customers)
        body = {"quote_id": quote["id"], "quote_version": quote["version"],
                "customer": {"reference": customer, "email": f"{customer}@example.com"}}
        p = self.post("/api/v1/purchases", body, uuid.uuid4().hex, 10)
        if p is not None and p.status_code == 409 and rng.random() < 0.5:
            unresolved = (p.json().get("unresolved") or
                          [p.json().get("purchase")])
            body["acknowledge_unresolved"] = [u for u in unresolved if u]
            self.count("second_purchase_acknowledged")
            p = self.post("/api/v1/purchases", body, uuid.uuid4().hex, 10)
        if p is None or p.status_code not in (200, 201):
            return
        purchase = p.json()
        pay_path = f"/api/v1/purchases/{purchase['id']}/payments"
        card = CARD_DECLINE if rng.random() < 0.1 else rng.choice(CARDS_OK)
        pay = {"payment_method": card, "capture": "automatic"}
        key = uuid.uuid4().hex
        for attempt in range(rng.randint(1, 5)):
            r = self.post(pay_path, pay, key, rng.choice([0.3, 1.0, 5.0, 15.0]))
            roll = rng.random()
            if r is not None and r.status_code == 402:
                op = r.json().get("operation")
                if op and rng.random() < 0.5:
                    pay = {"payment_method": rng.choice(CARDS_OK), "capture": "automatic",
                           "retry_of": op}
                    key = uuid.uuid4().hex
                    continue
                return
            if r is not None and r.status_code in (200, 201) and roll < 0.7:
                return
            # Careless retries: same key, a fresh key, or a varied body.
            if roll < 0.5:
                self.count("retry_same_key")
            elif roll < 0.8:
                key = uuid.uuid4().hex
                self.count("retry_new_key")
            else:
                key = uuid.uuid4().hex
                pay = dict(pay, amount=purchase["amount"] + rng.randint(1, 500))
                self.count("retry_varied_amount")
            time.sleep(rng.random() * 0.5)


def chaos(services: Services, stack: Stack, deadline: float, rng: random.Random,
          stats: dict, lock: threading.Lock) -> None:
    while time.monotonic() < deadline - 5:
        time.sleep(rng.uniform(5, 12))
        if time.monotonic() >= deadline - 5:
            return
        if rng.random() < 0.6:
            services.kill_worker(rng)
            what = "worker_sigkill"
        else:
            restart_redis(stack, rng.uniform(1, 4))
            what = "redis_restart"
        with lock:
            stats[what] = stats.get(what, 0) + 1


def drain(env: dict, seconds: float) -> float:
    """Wait until no dispatch is open, the outbox is empty and paid purchases are done."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from payments.enums import Outcome
    from payments.models import PaymentOperation, Purchase
    from recovery.models import OutboxMessage, StepRun

    start = time.monotonic()
    stable = 0
    while time.monotonic() - start < seconds:
        busy = (PaymentOperation.objects.filter(outcome__in=[Outcome.DISPATCHING,
                                                             Outcome.PENDING]).count()
                + OutboxMessage.objects.filter(
                    processed_at__isnull=True,
                    available_at__lte=timezone.now() - timedelta(seconds=30)).count()
                + StepRun.objects.filter(state__in=["pending", "running"]).exclude(
                    purchase_id__in=Purchase.objects.filter(status="manual_review")
                    .values("id")).count())
        stable = stable + 1 if busy == 0 else 0
        if stable >= 5:
            break
        connection.close()
        time.sleep(2)
    return time.monotonic() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--drain", type=float, default=180)
    ap.add_argument("--fault-rate", type=float, default=0.15)
    args = ap.parse_args(argv)

    with Stack() as stack:
        logdir = stack.tmp / "soak-logs"
        logdir.mkdir()
        env = {**os.environ, **stack.env,
               "DJANGO_SETTINGS_MODULE": "config.settings",
               "STRIPE_WEBHOOK_SECRETS": SECRET,
               "STRIPE_CONNECT_TIMEOUT": "2", "STRIPE_READ_TIMEOUT": "5",
               "DISPATCH_LEASE_SECONDS": "12", "RECONCILE_SCHEDULE_SECONDS": "2,4,8",
               "OUTBOX_SWEEP_SECONDS": "1", "API_THROTTLE_RATE": "100000/min",
               "STEP_LEASE_SECONDS": "10", "EMAIL_TIMEOUT": "5",
               "PAID_WITHOUT_ORDER_SECONDS": "5", "STALLED_FULFILMENT_SWEEP_SECONDS": "2",
               "RECONCILE_SWEEP_SECONDS": "1", "DEAD_DISPATCH_SWEEP_SECONDS": "2",
               "FAULT_DRILL_RANDOM_RATE": str(args.fault_rate),
               "FAULT_DRILL_RANDOM_SEED": str(args.seed),
               "CELERY_DB_REUSE_MAX": "1000"}
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                       check=True)
        out = subprocess.run([sys.executable, "manage.py", "create_api_client", "soak",
                              "--scopes", "purchases:read", "purchases:write", "refunds:write",
                              "--limit", "0",
                              # its journeys name earlier purchases in acknowledge_unresolved
                              # as a storefront's own checkout would (DESIGN §6)
                              "--storefront-confirmation"], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True).stdout
        key = out.strip().splitlines()[-1]
        os.environ.update(env)
        import django

        django.setup()
        from payments.models import Product

        skus = []
        for i, price in enumerate([700, 1250, 1800, 2600]):
            Product.objects.get_or_create(sku=f"SOAK-{i}", defaults={
                "name": f"Soak item {i}", "price": price, "stock": 10**8})
            skus.append(f"SOAK-{i}")

        services = Services(stack, env, logdir)
        services.start(chaos=True)
        requests.post(f"{stack.env['STRIPE_API_BASE']}/_config/webhooks/soak",
                      data={"url": f"http://127.0.0.1:{services.web_port}/webhooks/stripe/",
                            "secret": SECRET}, timeout=10).raise_for_status()
        base = f"http://127.0.0.1:{services.web_port}"
        stats, lock = {}, threading.Lock()
        deadline = time.monotonic() + args.seconds
        agents = [Agent(n, base, key, skus, deadline, args.seed, stats, lock)
                  for n in range(args.clients)]
        rng = random.Random(args.seed)
        chaos_thread = threading.Thread(target=chaos, args=(services, stack, deadline, rng,
                                                            stats, lock), daemon=True)
        t0 = time.monotonic()
        for a in agents:
            a.start()
        chaos_thread.start()
        for a in agents:
            a.join(timeout=max(0, deadline - time.monotonic()) + 30)
        chaos_thread.join(timeout=30)
        drove = time.monotonic() - t0

        # Drain without chaos: restart every process with faults off, let recovery run.
        services.stop()
        services.start(chaos=False)
        drained = drain(env, args.drain)
        from bench.invariants import check

        report = check()
        services.stop()

        print(f"\nsoak: {drove:.0f}s driving, {args.clients} agents, seed {args.seed}, "
              f"fault rate {args.fault_rate}, drained in {drained:.0f}s")
        print("events: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.items())))
        report.print()
        if report.violations:
            print(f"\n{len(report.violations)} VIOLATION(S); logs kept in {logdir}")
            for v in report.violations:
                print("  - " + v)
            subprocess.run(["cp", "-r", str(logdir), "/tmp/verity-soak-logs"], check=False)
            return 1
        print("\nno violations")
        return 0


if __name__ == "__main__":
    sys.exit(main())
