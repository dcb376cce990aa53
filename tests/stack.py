"""Throwaway real services on loopback: PostgreSQL, Redis, localstripe.

Used by `make test` (python -m tests.stack -- pytest ...) and by bench/ scripts
(`with Stack(): ...`). Each server gets a free port and a temp directory and is stopped
on exit. PostgreSQL refuses to run as root, so as root the cluster is created and
started as the `postgres` user (runuser). pytest-postgresql/pytest-redis are not used
because their executors cannot switch user, which this machine and CI need.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
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

    def __init__(self, *, redis: bool = True, localstripe: bool = True) -> None:
        self.want_redis = redis
        self.want_localstripe = localstripe
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
            _as_pg_user(["initdb", "-D", str(self.pgdata), "-U", "postgres", "-A", "trust",
                         "-E", "UTF8", "--no-sync"]),
            check=True, stdout=subprocess.DEVNULL,
        )
        opts = (f"-p {port} -k {sockdir} -h 127.0.0.1 -c fsync=off -c synchronous_commit=off "
                f"-c full_page_writes=off -c max_connections=300")
        subprocess.run(
            _as_pg_user(["pg_ctl", "-D", str(self.pgdata), "-o", opts, "-w", "-l",
                         str(self.tmp / "pg.log"), "start"]),
            check=True, stdout=subprocess.DEVNULL,
        )
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-q",
                        "-c", "CREATE DATABASE verity"], check=True)
        self.env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/verity"
        self.pg_port = port

    def stop_postgres(self) -> None:
        if self.pgdata.exists():
            subprocess.run(_as_pg_user(["pg_ctl", "-D", str(self.pgdata), "-m", "immediate",
                                        "stop"]), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

    # -- Redis and localstripe ----------------------------------------------------
    def _spawn(self, cmd: list[str], port: int) -> subprocess.Popen:
        log = open(self.tmp / f"{Path(cmd[0]).name}-{port}.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)
        self.procs.append(proc)
        _wait_port(port, proc=proc)
        return proc

    def start_redis(self) -> None:
        port = free_port()
        self.redis_proc = self._spawn(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)], port)
        self.env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        self.env["CELERY_BROKER_URL"] = f"redis://127.0.0.1:{port}/0"
        self.redis_port = port

    def start_localstripe(self) -> None:
        port = free_port()
        self._spawn([sys.executable, "-m", "config.localstripe_server", "--port", str(port)],
                    port)
        self.env["STRIPE_API_BASE"] = f"http://127.0.0.1:{port}"
        self.env["STRIPE_API_KEY"] = "sk_test_verity_stack"
        self.localstripe_port = port

    def __enter__(self) -> "Stack":
        try:
            self.start_postgres()
            if self.want_redis:
                self.start_redis()
            if self.want_localstripe:
                self.start_localstripe()
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


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        argv = [sys.executable, "-m", "pytest"]
    with Stack() as stack:
        env = {**os.environ, **stack.env}
        print(f"stack: postgres:{stack.pg_port} redis:{stack.redis_port} "
              f"localstripe:{stack.localstripe_port}", flush=True)
        proc = subprocess.Popen(argv, env=env, cwd=ROOT)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
