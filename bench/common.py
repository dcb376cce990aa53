"""Shared plumbing for the bench scripts: a throwaway stack, gunicorn, wrk, medians, tables.

Every script starts what it needs on loopback (tests.stack.Stack: PostgreSQL, Redis,
localstripe), migrates, measures, prints its rows, and can dump them as JSON for
bench/run_all.py. Figures are medians of several runs; headlines are ratios against a
floor measured in the same run on the same PostgreSQL; timing is measured here, never
asserted in the test suite (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.stack import Stack, _wait_port, free_port  # noqa: E402

BIN = Path(sys.executable).parent
PY = sys.executable
WEBHOOK_SECRET = "whsec_bench_secret"
# The storefront API throttle keeps a per-client list of request times in Redis; at the
# default 6000/min a bench would be refused after 100 requests. A one-second window keeps
# the throttle (and its Redis round trips) in the measured path without refusing.
API_THROTTLE_RATE = "1000000/s"
WRK = shutil.which("wrk") or "/usr/bin/wrk"


def require_wrk() -> None:
    if not Path(WRK).exists():
        sys.exit(
            "bench: `wrk` is not installed (Debian/Ubuntu: apt-get install wrk); "
            "the HTTP benchmarks need it."
        )


@dataclass
class Row:
    """One line of the final table."""

    bench: str
    metric: str
    value: str
    floor: str = ""
    ratio: str = ""
    goal: str = ""
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, *args, **kw) -> Row:
        row = Row(*args, **kw)
        self.rows.append(row)
        return row

    def dump(self, path: str | None) -> None:
        if path:
            Path(path).write_text(json.dumps([asdict(r) for r in self.rows], indent=1))

    def print(self, title: str = "") -> None:
        print_table(self.rows, title)


def print_table(rows: list[Row], title: str = "") -> None:
    cols = ["bench", "metric", "value", "floor", "ratio", "goal", "note"]
    data = [[getattr(r, c) if not isinstance(r, dict) else r[c] for c in cols] for r in rows]
    widths = [
        max(len(c), *(len(str(d[i])) for d in data)) if data else len(c) for i, c in enumerate(cols)
    ]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=False))
    if title:
        print(f"\n== {title} ==")
    print(line)
    print("  ".join("-" * w for w in widths))
    for d in data:
        print("  ".join(str(v).ljust(w) for v, w in zip(d, widths, strict=False)))
    sys.stdout.flush()


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(x: float, digits: int = 0) -> str:
    if x != x:  # nan
        return "n/a"
    return f"{x:,.{digits}f}"


def ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}" if floor else "n/a"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the stack ----------------------------------------------------------------------------


def durable() -> bool:
    """--durable (or BENCH_DURABLE=1): PostgreSQL with synchronous_commit on, as production
    and the soak run it; the default cluster runs with it off (a commit is acknowledged
    before its WAL is flushed), which flatters every figure that commits."""
    return os.environ.get("BENCH_DURABLE", "") not in ("", "0")


@contextlib.contextmanager
def bench_stack(*, redis: bool = True, localstripe: bool = True, extra_env: dict | None = None):
    """Start PostgreSQL (+ Redis, localstripe), migrate, set up Django in this process.

    Yields (stack, env): `env` is what child processes (gunicorn, celery, manage.py) get.
    DJANGO_SETTINGS_MODULE is bench.settings: config.settings plus the floor views.
    """
    with Stack(redis=redis, localstripe=localstripe, durable=durable()) as stack:
        env = {
            **os.environ,
            **stack.env,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "STRIPE_WEBHOOK_SECRETS": WEBHOOK_SECRET,
            "API_THROTTLE_RATE": API_THROTTLE_RATE,
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
        log(
            f"stack up: {stack.env.get('DATABASE_URL')} (synchronous_commit "
            f"{'on' if durable() else 'off'}); migrating"
        )
        subprocess.run(
            [PY, "manage.py", "migrate", "--noinput", "-v", "0"], env=env, cwd=ROOT, check=True
        )
        os.environ.update(env)
        import django

        django.setup()
        yield stack, env


def manage(env: dict, *args: str) -> str:
    out = subprocess.run(
        [PY, "manage.py", *args], env=env, cwd=ROOT, check=True, capture_output=True, text=True
    )
    return out.stdout


@contextlib.contextmanager
def gunicorn(env: dict, stack: Stack, *, workers: int = 4, root: Path | None = None):
    """gunicorn (sync workers) with the bench settings; yields the base URL. `root`: run
    the code of another checkout (bench/ab_reads.py), same stack."""
    port = free_port()
    if root is not None:
        env = {**env, "PYTHONPATH": str(root)}
    logf = open(stack.tmp / f"gunicorn-{port}.log", "ab")
    proc = subprocess.Popen(
        [
            str(BIN / "gunicorn"),
            "config.wsgi:application",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            str(workers),
            "--backlog",
            "2048",
            "--timeout",
            "60",
        ],
        env=env,
        cwd=root or ROOT,
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_port(port, timeout=60, proc=proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        # Warm every worker (imports, first DB connection) before anything is timed.
        for _ in range(workers * 4):
            with contextlib.suppress(Exception):
                urllib.request.urlopen(f"{base}/healthz", timeout=5).read()
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        logf.close()


# -- wrk ----------------------------------------------------------------------------------

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")


@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    non2xx: int
    errors: int


def wrk(
    url: str, script: Path, *, seconds: float, connections: int = 16, env: dict | None = None
) -> WrkResult:
    """One wrk run (one thread: request order is the script's order, so a 'new' event in
    the script is never sent by two threads)."""
    out = subprocess.run(
        [WRK, "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=seconds + 60,
    )
    text = out.stdout
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed: {out.stderr or text}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", text, re.M).group(1))
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1))
    reqs = int(re.search(r"(\d+) requests in", text).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return WrkResult(
        rps,
        p50,
        p99,
        reqs,
        int(non2xx.group(1)) if non2xx else 0,
        sum(int(g) for g in errs.groups()) if errs else 0,
    )


def http_json(
    method: str, url: str, body: dict | None = None, headers: dict | None = None
) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def machine() -> dict:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    pg = (
        subprocess.run(["postgres", "--version"], capture_output=True, text=True).stdout.strip()
        if shutil.which("postgres")
        else ""
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "postgres": pg,
        "python": sys.version.split()[0],
        "load": os.getloadavg(),
    }


class _Durable(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)
        os.environ["BENCH_DURABLE"] = "1"  # read by bench_stack (and child processes)


def common_args(parser) -> None:
    parser.add_argument("--json", help="also write the rows as JSON to this path")
    parser.add_argument(
        "--durable",
        action=_Durable,
        nargs=0,
        default=False,
        help="synchronous_commit on (as production), not off",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
