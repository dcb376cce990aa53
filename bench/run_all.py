"""Run every benchmark (each in its own process and throwaway stack) and print ONE table.

    make bench                                  # full sizes (long: see docs/performance.md)
    .venv/bin/python bench/run_all.py --quick   # small sizes, one run each: a smoke check
    .venv/bin/python bench/run_all.py --only webhook_ingest,outbox_drain
    BENCH_ARGS="--quick" make bench
    .venv/bin/python bench/run_all.py --quiet    # no progress line
    .venv/bin/python bench/run_all.py --durable  # synchronous_commit on, as in production
    .venv/bin/python bench/run_all.py --svg docs/bench.svg --json var/bench.json
    .venv/bin/python bench/run_all.py --from-json var/bench.json --svg docs/bench.svg

Progress (tools/progress.py, on stderr): which benchmark is running, its latest
"run k/n" line and, for the scale fill, rows written against the target with the time
left; redrawn in place on a terminal, a plain line every 10 s in a log. Each benchmark's
own output is forwarded line by line.

Figures are medians of --runs runs; every headline is a ratio against a floor measured in
the same run on the same PostgreSQL. Benchmarks print figures; they never assert timings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PY, ROOT, Row, machine, print_table, require_wrk  # noqa: E402
from tools.progress import Progress, fmt_duration  # noqa: E402

BENCHES = {
    "webhook_ingest": {"full": [], "quick": ["--seconds", "4"]},
    "idempotent_replay": {"full": [], "quick": ["--seconds", "4"]},
    "outbox_drain": {"full": [], "quick": ["--messages", "5000"]},
    "reconcile_sweep": {"full": [], "quick": ["--n", "300"]},
    "webhook_delivery": {"full": [], "quick": ["--events", "300", "--runs", "1"]},
    "scale": {"full": [], "quick": ["--sizes", "2000,10000", "--reps", "5"]},
    # 5 M processed outbox rows + 5 M events vs empty tables (docs/retention.md).
    "history": {
        "full": [],
        "quick": [
            "--rows",
            "200000",
            "--seconds",
            "4",
            "--messages",
            "5000",
            "--prune-batches",
            "20",
        ],
    },
    # One payment through Verity against a direct create(confirm=true), provider answers
    # held 100 ms (bench/pay_latency.py), with the SQL statements of one payment.
    "pay_latency": {
        "full": ["--profile", "--modes", "one-call,two-step"],
        "quick": ["--payments", "8", "--connections", "4", "--profile"],
    },
}


def _run_forwarding(cmd: list[str], progress: Progress, state: dict) -> int:
    """Run one benchmark, forwarding its output line by line above the status line; its
    latest log line (e.g. "run 2/3: floor") becomes part of the status."""
    if progress.quiet:
        return subprocess.run(cmd, cwd=ROOT, env=os.environ.copy()).returncode
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )

    def pump() -> None:
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            progress.note(line)
            if line.strip():
                state["last"] = line.strip()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    returncode = proc.wait()
    reader.join(timeout=10)
    return returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 run each")
    parser.add_argument("--runs", type=int, default=None, help="runs per figure (default 3)")
    parser.add_argument("--only", default="", help="comma-separated subset of " + ",".join(BENCHES))
    parser.add_argument("--json", help="write all rows and the machine as JSON here")
    parser.add_argument("--reconcile-n", type=int, help="unknown operations (default 10000)")
    parser.add_argument("--scale-sizes", help="e.g. 10000,100000 (default up to 1000000)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument(
        "--durable",
        action="store_true",
        help="PostgreSQL with synchronous_commit on, as in production",
    )
    parser.add_argument("--svg", help="also draw the ratios against their goals here (SVG)")
    parser.add_argument(
        "--from-json", help="no run: redraw --svg / the table from a --json file written earlier"
    )
    # `make bench` takes no arguments: BENCH_ARGS="--quick" make bench passes them through.
    args = parser.parse_args(sys.argv[1:] + os.environ.get("BENCH_ARGS", "").split())
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        rows = [Row(**r) for r in saved["rows"]]
        print_table(rows, "Verity benchmarks (ratios against floors measured in the same run)")
        if args.svg:
            from bench.chart import write_ratio_chart

            write_ratio_chart(rows, args.svg, title="Verity: ratio to the floor, against goals")
        return 0
    require_wrk()
    names = [n for n in BENCHES if not args.only or n in args.only.split(",")]
    runs = args.runs or (1 if args.quick else 3)
    rows: list[Row] = []
    failed = []
    started = time.monotonic()
    state = {"i": 0, "name": "", "since": started, "last": "", "done": []}

    def status() -> str:
        done = ", ".join(state["done"][-3:])
        return (
            f"bench {state['i']}/{len(names)} {state['name']} "
            f"({fmt_duration(time.monotonic() - state['since'])})"
            + (f" | {state['last'][:90]}" if state["last"] else "")
            + (f" | done: {done}" if done else "")
        )

    progress = Progress(status, label="bench", quiet=args.quiet)
    with tempfile.TemporaryDirectory(prefix="verity-bench-") as tmp, progress:
        for name in names:
            out = Path(tmp) / f"{name}.json"
            extra = list(BENCHES[name]["quick" if args.quick else "full"])
            if name == "reconcile_sweep" and args.reconcile_n:
                extra += ["--n", str(args.reconcile_n)]
            if name == "scale" and args.scale_sizes:
                extra += ["--sizes", args.scale_sizes]
            if args.durable:
                extra.append("--durable")
            cmd = [
                PY,
                str(ROOT / "bench" / f"{name}.py"),
                "--json",
                str(out),
                "--runs",
                str(runs),
                *extra,
            ]
            state.update(i=state["i"] + 1, name=name, since=time.monotonic(), last="")
            progress.note(f"\n### {name}: {' '.join(cmd[1:])}")
            t = time.monotonic()
            returncode = _run_forwarding(cmd, progress, state)
            if returncode != 0 or not out.exists():
                failed.append(name)
                rows.append(Row(name.replace("_", " "), "FAILED", f"exit {returncode}"))
                state["done"].append(f"{name} FAILED")
                continue
            for r in json.loads(out.read_text()):
                if args.durable:
                    r["bench"] += " (durable)"
                rows.append(Row(**r))
            progress.note(f"### {name}: {time.monotonic() - t:.0f}s")
            state["done"].append(f"{name} {time.monotonic() - t:.0f}s")
    m = machine()
    print(
        f"\nmachine: {m['nproc']} cores, {m['cpu']}, {m['memory']}, {m['postgres']}, "
        f"Python {m['python']}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in m['load'])} (shared, noisy machine)"
    )
    print(
        f"total {time.monotonic() - started:.0f}s; runs per figure: {runs}"
        + ("; QUICK sizes" if args.quick else "")
        + ("; DURABLE (synchronous_commit on)" if args.durable else "")
    )
    print_table(rows, "Verity benchmarks (ratios against floors measured in the same run)")
    if args.svg:
        from bench.chart import write_ratio_chart

        write_ratio_chart(
            rows,
            args.svg,
            title="Verity: ratio to the floor, against goals"
            + (" (quick sizes)" if args.quick else ""),
        )
        print(f"chart: {args.svg}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": m,
                    "quick": args.quick,
                    "runs": runs,
                    "rows": [r.__dict__ for r in rows],
                },
                indent=1,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
