"""Throwaway real services on loopback: PostgreSQL, Redis, localstripe.

Used by `make test` (python -m tests.stack -- pytest ...) and by bench/ scripts
(`with Stack(): ...`). Each server gets a free port and a temp directory and is stopped
on exit. With `pytest -n N` (pytest-xdist) N stacks are started, one per worker. PostgreSQL refuses
to run as root, so as root the cluster is created and
started as the `postgres` user (runuser). pytest-postgresql/pytest-redis are not used
because their executors cannot switch user, which this machine and CI need.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for port {port} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def _as_pg_user(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


class Stack:
    """Context manager; `env` holds the variables Verity reads."""

    def __init__(
        self,
        *,
        redis: bool = True,
        localstripe: bool = True,
        x402: bool = False,
        durable: bool = False,
        replica: bool = False,
    ) -> None:
        # durable: commits survive a crash of the server (synchronous_commit on, as in
        # production). The test suite trades that for speed; the soak, which crash-restarts
        # PostgreSQL (`-m immediate`), must not: with synchronous_commit off a commit Verity
        # already answered for (a webhook's 200) can vanish in the crash.
        self.durable = durable
        self.want_redis = redis
        self.want_localstripe = localstripe
        self.want_x402 = x402
        # replica: a hot standby streaming from the primary (DATABASE_REPLICA_URL), for the
        # replica-read tests (tests/replica, docs/scaling.md).
        self.want_replica = replica
        self.tmp = Path(tempfile.mkdtemp(prefix="verity-stack-"))
        self.procs: list[subprocess.Popen] = []
        self.pgdata = self.tmp / "pg"
        self.env: dict[str, str] = {}

    # -- PostgreSQL ---------------------------------------------------------------
    def start_postgres(self) -> None:
        port = free_port()
        sockdir = self.tmp / "pgsock"
        sockdir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres")
            shutil.chown(sockdir, "postgres")
        subprocess.run(
            _as_pg_user(
                [
                    "initdb",
                    "-D",
                    str(self.pgdata),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # fsync and full-page writes guard against the machine crashing, not the server:
        # off in both modes (the soak kills processes, never the machine).
        commit = "on" if self.durable else "off"
        opts = (
            f"-p {port} -k {sockdir} -h 127.0.0.1 -c fsync=off -c synchronous_commit={commit} "
            f"-c full_page_writes=off -c max_connections=300"
        )
        subprocess.run(
            _as_pg_user(
                [
                    "pg_ctl",
                    "-D",
                    str(self.pgdata),
                    "-o",
                    opts,
                    "-w",
                    "-l",
                    str(self.tmp / "pg.log"),
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "-q",
                "-c",
                "CREATE DATABASE verity",
            ],
            check=True,
        )
        self.env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/verity"
        self.pg_port = port

    def start_replica(self, timeout: float = 60.0) -> None:
        """A streaming hot standby of the primary: pg_basebackup -R (it writes
        primary_conninfo and standby.signal) into a second data directory, started on a free
        loopback port as the same user, then awaited until its WAL receiver is `streaming`
        (not merely accepting connections: a standby answers before it has connected to
        its primary). initdb's pg_hba.conf already trusts replication from 127.0.0.1, and
        wal_level=replica / max_wal_senders are PostgreSQL's defaults."""
        port = free_port()
        self.replica_data = self.tmp / "pg-replica"
        subprocess.run(
            _as_pg_user(
                [
                    "pg_basebackup",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.pg_port),
                    "-U",
                    "postgres",
                    "-D",
                    str(self.replica_data),
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    "--no-sync",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # Its own socket directory: the primary's lock file there names the primary's port.
        sockdir = self.tmp / "pgsock-replica"
        sockdir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(sockdir, "postgres")
        # hot_standby_feedback: a long console read on the standby is not cancelled by the
        # primary's vacuum (the setting docs/scaling.md recommends for production too).
        opts = (
            f"-p {port} -k {sockdir} -h 127.0.0.1 -c fsync=off -c full_page_writes=off "
            f"-c max_connections=300 -c hot_standby=on -c hot_standby_feedback=on"
        )
        subprocess.run(
            _as_pg_user(
                [
                    "pg_ctl",
                    "-D",
                    str(self.replica_data),
                    "-o",
                    opts,
                    "-w",
                    "-l",
                    str(self.tmp / "pg-replica.log"),
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            status = subprocess.run(
                [
                    "psql",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-U",
                    "postgres",
                    "-d",
                    "verity",
                    "-qAtc",
                    "SELECT status FROM pg_stat_wal_receiver",
                ],
                capture_output=True,
                text=True,
            ).stdout.strip()
            if status == "streaming":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the replica on port {port} is not streaming after "
                    f"{timeout}s (status {status!r}); see pg-replica.log"
                )
            time.sleep(0.1)
        self.env["DATABASE_REPLICA_URL"] = f"postgres://postgres@127.0.0.1:{port}/verity"
        self.replica_port = port

    def stop_postgres(self) -> None:
        for data in (getattr(self, "replica_data", None), self.pgdata):
            if data is not None and data.exists():
                subprocess.run(
                    _as_pg_user(["pg_ctl", "-D", str(data), "-m", "immediate", "stop"]),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )

    # -- Redis and localstripe ----------------------------------------------------
    def _spawn(self, cmd: list[str], port: int) -> subprocess.Popen:
        log = open(self.tmp / f"{Path(cmd[0]).name}-{port}.log", "wb")
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        self.procs.append(proc)
        _wait_port(port, proc=proc)
        return proc

    def start_redis(self) -> None:
        port = free_port()
        self.redis_proc = self._spawn(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            port,
        )
        self.env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        self.env["CELERY_BROKER_URL"] = f"redis://127.0.0.1:{port}/0"
        self.redis_port = port

    def start_localstripe(self) -> None:
        port = free_port()
        self._spawn([sys.executable, "-m", "tools.localstripe_server", "--port", str(port)], port)
        self.env["STRIPE_API_BASE"] = f"http://127.0.0.1:{port}"
        self.env["STRIPE_API_KEY"] = "sk_test_verity_stack"
        self.localstripe_port = port

    def start_x402(self, *, payers: int = 12, confirmation_timeout: float = 3.0) -> None:
        """anvil (npm @foundry-rs/anvil) with Circle's FiatTokenV2_2 deployed, and the
        SDK's facilitator behind tools/x402_facilitator.py. Keys are minted per run."""
        from tools import x402_chain

        port = free_port()
        self._spawn(x402_chain.anvil_command(port), port)
        rpc = f"http://127.0.0.1:{port}"
        fac_key, fac_address = x402_chain.new_key()
        # Verity's receiving address (its key is dropped: Verity only receives there) and
        # the separate refund account, its float minted by the token's minter.
        _pay_key, pay_to = x402_chain.new_key()
        refund_key, refund_account = x402_chain.new_key()
        payer_keys = [x402_chain.new_key() for _ in range(payers)]
        info = x402_chain.deploy(
            rpc,
            payers=[a for _k, a in payer_keys],
            facilitator=fac_address,
            refund_account=refund_account,
        )
        fport = free_port()
        log = open(self.tmp / f"x402-facilitator-{fport}.log", "wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tools.x402_facilitator",
                "--port",
                str(fport),
                "--rpc-url",
                rpc,
                "--network",
                info["network"],
                "--confirmation-timeout",
                str(confirmation_timeout),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            env={**os.environ, "X402_FACILITATOR_KEY": fac_key},
        )
        self.procs.append(proc)
        _wait_port(fport, proc=proc)
        self.env.update(
            {
                "X402_ENABLED": "true",
                "X402_LOCAL_CHAIN": "true",
                "X402_RPC_URL": rpc,
                "X402_FACILITATOR_URL": f"http://127.0.0.1:{fport}",
                "X402_NETWORK": info["network"],
                "X402_ASSET": info["asset"],
                "X402_PAY_TO": pay_to,
                "X402_TOKEN_NAME": info["token_name"],
                "X402_TOKEN_VERSION": info["token_version"],
                "X402_REFUND_PRIVATE_KEY": refund_key,
                # Test-only: the chain's unlocked admin (minter, blacklister) and payer keys.
                "X402_CHAIN_ADMIN": info["admin"],
                "X402_FACILITATOR_ADDRESS": fac_address,
                "X402_PAYER_KEYS": ",".join(k for k, _a in payer_keys),
            }
        )
        self.x402_ports = (port, fport)

    def __enter__(self) -> Stack:
        try:
            self.start_postgres()
            if self.want_replica:
                self.start_replica()
            if self.want_redis:
                self.start_redis()
            if self.want_localstripe:
                self.start_localstripe()
            if self.want_x402:
                self.start_x402()
        except BaseException:
            self.close()
            raise
        self.env["VERITY_STACK_DIR"] = str(self.tmp)
        # DEBUG stays off (production behaviour), so the stack supplies what production
        # must (config/settings/security.py refuses the defaults): a throwaway key, a mail
        # backend that is not the console, and plain-http cookies on loopback.
        self.env.setdefault("SECRET_KEY", secrets.token_urlsafe(48))
        self.env.setdefault("EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend")
        self.env.setdefault("SESSION_COOKIE_SECURE", "false")
        # Tests read /metrics right after changing rows: no scrape cache (its own test
        # turns it on).
        self.env.setdefault("METRICS_CACHE_SECONDS", "0")
        # Every test client is 127.0.0.1 and the suite sends many bad keys on purpose; the
        # failed-authentication throttle's own test sets the production limits.
        self.env.setdefault("API_AUTH_FAILURES_PER_ADDRESS", "1000000")
        # The suite, the lifecycle machine and the soak settle many x402 payments per
        # client per minute; the settle limit's own test sets a small rate.
        self.env.setdefault("X402_SETTLE_RATE", "1000000/min")
        return self

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        self.stop_postgres()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __exit__(self, *exc) -> None:
        self.close()


def pytest_workers(argv: list[str]) -> int:
    """How many pytest-xdist workers the command asks for (`-n N`, `-nN`,
    `--numprocesses N`/`=N`); 0 without xdist or for another command. `auto` is refused:
    each worker gets its own stack, so the count must be known before pytest starts."""
    if not any(Path(a).name.startswith("pytest") for a in argv[:3]):
        return 0  # python -m bench.x402_drill etc.: its -n is not pytest's
    for i, arg in enumerate(argv):
        value = None
        if arg in ("-n", "--numprocesses") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--numprocesses="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-n") and len(arg) > 2 and not arg.startswith("--"):
            value = arg[2:]
        if value is not None:
            if not value.isdigit():
                raise SystemExit(f"tests.stack: give pytest -n a number, not {value!r}")
            return int(value)
    return 0


# Each pytest-xdist worker gets a whole stack of its own (database, Redis, localstripe, chain):
# the x402 tests move the chain's clock and toggle automine, localstripe is counted and
# flushed, the Celery fixture empties the broker. Shared across workers, one test would see
# another's effects; one stack per worker keeps every test's world exactly what it is in a
# serial run. The workers' environments are written to this file; the `tests.xdist_stack`
# plugin (PYTEST_PLUGINS, set here) adopts worker gwK's before Django reads its settings.
WORKERS_FILE = "VERITY_STACK_WORKERS_FILE"


def _start_stacks(count: int, x402: bool, replica: bool = False) -> list[Stack]:
    """Start `count` stacks side by side (their start-up is mostly waiting: initdb, the chain's
    deployment); all are stopped again if one fails."""
    from concurrent.futures import ThreadPoolExecutor

    stacks = [Stack(x402=x402, replica=replica) for _ in range(count)]
    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(s.__enter__) for s in stacks]
        errors = [f.exception() for f in futures]
    if any(errors):
        for s in stacks:
            s.close()
        raise next(e for e in errors if e)
    return stacks


def main(argv: list[str]) -> int:
    # `--x402` (or VERITY_STACK_X402=1) also starts the chain and the facilitator; the
    # other tests do not pay for their start-up (tests/x402 needs them).
    x402 = os.environ.get("VERITY_STACK_X402", "") in ("1", "true")
    # `--replica` (or VERITY_STACK_REPLICA=1) also starts a streaming standby of each stack's
    # PostgreSQL and sets DATABASE_REPLICA_URL (tests/replica needs it; nothing else does).
    replica = os.environ.get("VERITY_STACK_REPLICA", "") in ("1", "true")
    while argv and argv[0] in ("--x402", "--replica"):
        if argv[0] == "--x402":
            x402 = True
        else:
            replica = True
        argv = argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        argv = [sys.executable, "-m", "pytest"]
    stacks = _start_stacks(max(1, pytest_workers(argv)), x402, replica)
    try:
        # The controller (collection, and a run without -n) uses the first stack.
        env = {**os.environ, **stacks[0].env}
        for i, stack in enumerate(stacks):
            extra = (
                f" anvil:{stack.x402_ports[0]} x402-facilitator:{stack.x402_ports[1]}"
                if x402
                else ""
            )
            extra += f" postgres-replica:{stack.replica_port}" if replica else ""
            print(
                f"stack{i if len(stacks) > 1 else ''}: postgres:{stack.pg_port} "
                f"redis:{stack.redis_port} localstripe:{stack.localstripe_port}{extra}",
                flush=True,
            )
        if pytest_workers(argv):
            workers = stacks[0].tmp / "workers.json"
            workers.write_text(json.dumps([s.env for s in stacks]))
            env[WORKERS_FILE] = str(workers)
            # Loaded while pytest reads its options, before pytest-django reads settings
            # (a plugin named by PYTEST_PLUGINS; importable from the checkout's root).
            env["PYTEST_PLUGINS"] = ",".join(
                p for p in (env.get("PYTEST_PLUGINS", ""), "tests.xdist_stack") if p
            )
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
            )
        proc = subprocess.Popen(argv, env=env, cwd=ROOT)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()
    finally:
        for stack in stacks:
            stack.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
