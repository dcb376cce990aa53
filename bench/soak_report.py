"""What the soak saw: every request (endpoint, answer, latency, time), every fault, and the
tables and the SVG chart made from them."""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

_ID = re.compile(r"/(pur|op|quo|evt)_[A-Za-z0-9]+")
BUCKET_SECONDS = 5


def endpoint_of(method: str, path: str) -> str:
    return f"{method} {_ID.sub(lambda m: '/{' + m.group(1) + '}', path)}"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@dataclass
class Fault:
    t: float  # seconds since the start of the run
    kind: str
    detail: str = ""
    seconds: float = 0.0  # how long it lasted (outages, restarts)


@dataclass
class Recorder:
    started: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, str, str, float, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    counters: Counter = field(default_factory=Counter)
    inflight: int = 0
    # (start, end) windows in run seconds where a 503 of that code is the expected answer
    windows: dict[str, list[list[float]]] = field(default_factory=lambda: defaultdict(list))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.monotonic() - self.started

    def record(self, endpoint: str, status: str, ms: float, code: str = "") -> None:
        with self.lock:
            self.samples.append((self.now(), endpoint, status, ms, code))

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counters[what] += n

    def fault(
        self, kind: str, detail: str = "", seconds: float = 0.0, at: float | None = None
    ) -> Fault:
        """`at` (monotonic) is when the fault began; default now."""
        t = self.now() if at is None else at - self.started
        f = Fault(round(t, 1), kind, detail, seconds)
        with self.lock:
            self.faults.append(f)
        return f

    def window_open(self, code: str) -> list[float]:
        w = [self.now(), float("inf")]
        with self.lock:
            self.windows[code].append(w)
        return w

    def window_close(self, w: list[float]) -> None:
        w[1] = self.now()

    def in_window(self, code: str, t: float, grace: float) -> bool:
        return any(a - 1 <= t <= b + grace for a, b in self.windows.get(code, []))

    # -- summaries ---------------------------------------------------------------------
    def status_counts(self) -> Counter:
        with self.lock:
            return Counter(s[2] for s in self.samples)

    def fault_counts(self) -> Counter:
        with self.lock:
            return Counter(f.kind for f in self.faults)

    def disallowed_5xx(self, grace: float = 10.0) -> list[tuple]:
        """5xx answers that are defects: anything but a 503 with Retry-After that is
        `database_unavailable` while the database is down (plus a grace for connections
        that learn of the restart on first use) or `workflow_halted` while a halt is set."""
        bad = []
        with self.lock:
            samples = list(self.samples)
        for t, endpoint, status, _ms, code in samples:
            if not status.isdigit() or int(status) < 500:
                continue
            if (
                status == "503"
                and code in ("database_unavailable", "workflow_halted")
                and self.in_window(code, t, grace)
            ):
                continue
            bad.append((round(t, 1), endpoint, status, code))
        return bad

    def endpoint_table(self) -> str:
        with self.lock:
            samples = list(self.samples)
        by_ep: dict[str, list] = defaultdict(list)
        for s in samples:
            by_ep[s[1]].append(s)
        rows = []
        for ep in sorted(by_ep, key=lambda e: -len(by_ep[e])):
            ss = by_ep[ep]
            ms = [s[3] for s in ss if s[2].isdigit()]
            answers = Counter(s[2] if s[2] != "503" or not s[4] else f"503 {s[4]}" for s in ss)
            rows.append(
                (
                    ep,
                    str(len(ss)),
                    f"{pct(ms, 0.5):.0f}",
                    f"{pct(ms, 0.99):.0f}",
                    ", ".join(f"{k}:{v}" for k, v in sorted(answers.items())),
                )
            )
        head = ("endpoint", "requests", "p50 ms", "p99 ms", "answers by status")
        widths = [
            max(len(head[i]), *(len(r[i]) for r in rows)) if rows else len(head[i])
            for i in range(4)
        ]
        out = [
            "  ".join(h.ljust(w) for h, w in zip(head[:4], widths, strict=False)) + "  " + head[4],
            "  ".join("-" * w for w in widths) + "  " + "-" * 20,
        ]
        for r in rows:
            out.append(
                "  ".join(
                    v.rjust(w) if i else v.ljust(w)
                    for i, (v, w) in enumerate(zip(r[:4], widths, strict=False))
                )
                + "  "
                + r[4]
            )
        return "\n".join(out)

    def fault_table(self) -> str:
        out = [f"{'at (s)':>7}  {'fault':18} {'lasted':>7}  detail", "-" * 70]
        for f in sorted(self.faults, key=lambda f: f.t):
            lasted = f"{f.seconds:.1f}s" if f.seconds else ""
            out.append(f"{f.t:7.1f}  {f.kind:18} {lasted:>7}  {f.detail}")
        return "\n".join(out)

    def timeline(self) -> list[dict]:
        with self.lock:
            samples = list(self.samples)
        buckets: dict[int, list] = defaultdict(list)
        for s in samples:
            buckets[int(s[0] // BUCKET_SECONDS)].append(s)
        out = []
        for b in range(0, (max(buckets) + 1) if buckets else 0):
            ss = buckets.get(b, [])
            ms = [s[3] for s in ss if s[2].isdigit()]
            out.append(
                {
                    "t": b * BUCKET_SECONDS,
                    "rps": len(ss) / BUCKET_SECONDS,
                    "p50": pct(ms, 0.5) if ms else 0,
                    "p99": pct(ms, 0.99) if ms else 0,
                    # client timeouts are the careless agents' own (0.3 s and up)
                    "errors": sum(
                        1
                        for s in ss
                        if s[2] == "no_answer" or (s[2].isdigit() and int(s[2]) >= 500)
                    ),
                }
            )
        return out

    def chart_svg(self, title: str) -> str:
        """Throughput and latency over time, faults marked (pygal, a kept library)."""
        import pygal
        from pygal.style import Style

        tl = self.timeline()
        style = Style(
            background="white",
            plot_background="white",
            font_family="sans-serif",
            colors=(
                "#1f77b4",
                "#ff7f0e",
                "#d62728",
                "#7f7f7f",
                "#2ca02c",
                "#9467bd",
                "#8c564b",
                "#e377c2",
                "#17becf",
                "#bcbd22",
            ),
        )
        chart = pygal.XY(
            style=style,
            title=title,
            x_title="seconds into the run",
            y_title="requests per second",
            show_dots=False,
            width=1100,
            height=520,
            legend_at_bottom=True,
            legend_at_bottom_columns=4,
            truncate_legend=-1,
            dots_size=4,
        )
        chart.add("throughput (req/s)", [(p["t"], p["rps"]) for p in tl])
        chart.add(
            "5xx answers or connection lost (per s)",
            [(p["t"], p["errors"] / BUCKET_SECONDS) for p in tl],
        )
        chart.add("p50 latency (ms, right axis)", [(p["t"], p["p50"]) for p in tl], secondary=True)
        chart.add("p99 latency (ms, right axis)", [(p["t"], p["p99"]) for p in tl], secondary=True)
        top = max((p["rps"] for p in tl), default=1) or 1
        for kind, faults in sorted(_group(self.faults).items()):
            # Each fault is a marker at its start; an outage is a bar over its duration.
            points = []
            for f in faults:
                points += [(f.t, 0), (f.t, top * 1.05)]
                if f.seconds:
                    points += [(f.t + f.seconds, top * 1.05), (f.t + f.seconds, 0)]
                points.append(None)
            chart.add(
                f"fault: {kind} ({len(faults)})",
                points,
                show_dots=False,
                stroke_style={"width": 2, "dasharray": "4, 3"},
            )
        return chart.render(is_unicode=True)


def _group(faults: list[Fault]) -> dict[str, list[Fault]]:
    out: dict[str, list[Fault]] = defaultdict(list)
    for f in faults:
        out[f.kind].append(f)
    return out


def summary_line(values: list[float]) -> str:
    return f"median {statistics.median(values):.0f}" if values else "n/a"


# -- paid -> completed ------------------------------------------------------------------


@dataclass
class Fulfilment:
    """One paid purchase as its rows say: when it was paid (`paid_at`), entered
    `fulfilling` (a worker took its steps) and `completed` (the last of them done), in
    seconds since the start of the run; None where it never did."""

    paid: float
    fulfilling: float | None
    completed: float | None
    status: str


def _ms_row(label: str, values: list[float]) -> str:
    if not values:
        return f"  {label:34} {'n/a':>6}"
    ms = [v * 1000 for v in values]
    return f"  {label:34} {len(ms):>6} {pct(ms, 0.5):>9.0f} {pct(ms, 0.99):>9.0f} {max(ms):>9.0f}"


def paid_to_completed(
    rows: list[Fulfilment],
    steps: dict[str, list[float]],
    *,
    faults: list[Fault],
    drove: float,
    restarted: float,
) -> tuple[str, dict]:
    """The time from "paid" to "completed" (the purchase's downstream steps through the
    outbox and a worker), from the database rows: every purchase paid while the soak drove,
    then only those no fault touched between their payment and their completion (the
    restart for the drain, from `drove` to `restarted`, counts as one), split into the wait
    for a worker (paid -> fulfilling) and the steps themselves (fulfilling -> completed).
    `steps`: each step's run times (s, `started_at` -> `completed_at`). Returns the table
    and its figures."""
    spans = [(f.t, f.t + f.seconds) for f in faults] + [(drove, restarted)]

    def clear(r: Fulfilment) -> bool:
        assert r.completed is not None
        return not any(a <= r.completed and b >= r.paid for a, b in spans)

    driving = [r for r in rows if r.paid <= drove]
    done = [r for r in driving if r.completed is not None]
    untouched = [r for r in done if clear(r)]
    waits = [r for r in untouched if r.fulfilling is not None]
    figures: dict = {"paid_while_driving": len(driving), "completed": len(done)}

    def put(name: str, values: list[float]) -> None:
        ms = [v * 1000 for v in values]
        figures[name] = (
            {
                "n": len(ms),
                "p50_ms": round(pct(ms, 0.5), 1),
                "p99_ms": round(pct(ms, 0.99), 1),
                "max_ms": round(max(ms), 1),
            }
            if ms
            else {"n": 0}
        )

    series = [
        ("paid -> completed, all", [r.completed - r.paid for r in done]),
        ("paid -> completed, no fault", [r.completed - r.paid for r in untouched]),
        ("  paid -> fulfilling (to a worker)", [r.fulfilling - r.paid for r in waits]),
        ("  fulfilling -> completed (steps)", [r.completed - r.fulfilling for r in waits]),
    ]
    out = [f"  {'':34} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}"]
    for label, values in series:
        out.append(_ms_row(label, values))
        put(label.strip(), values)
    for step, values in steps.items():
        out.append(_ms_row(f"  step {step}", values))
        put(f"step {step}", values)
    left = Counter(r.status for r in driving if r.completed is None)
    figures["not_completed"] = dict(left)
    out.append(
        "  paid while driving, not completed: "
        + (", ".join(f"{k} {v}" for k, v in sorted(left.items())) if left else "none")
    )
    return "\n".join(out), figures
