"""The replay and GET against their floor, this checkout and a baseline commit side by side
in ONE stack.

On this shared 2-core machine two runs of bench/idempotent_replay.py a minute apart differ
by more than most single changes are worth. Here both versions' gunicorns (4 sync workers
each) serve the same PostgreSQL, Redis and purchase, and wrk runs are interleaved — floor,
replay, GET of the baseline, then of this checkout, `--rounds` times — so a load spike hits
both alike. Per side: req/s against that side's floor, and the CPU each request cost, read
from /proc: the side's gunicorn processes, the PostgreSQL backends, Redis (wrk's own CPU is
not counted), and the gunicorn workers' voluntary context switches (a process going to
sleep, e.g. on a round trip) per request.

    .venv/bin/python bench/ab_reads.py --baseline af921b0 [--seconds 5] [--rounds 3]

The baseline is checked out into a temporary git worktree (removed at the end); it must
have this checkout's migrations (the stack is migrated once, by this checkout).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    Report,
    bench_stack,
    common_args,
    fmt,
    gunicorn,
    http_json,
    log,
    manage,
    med,
    require_wrk,
    wrk,
)

LUA = Path(__file__).resolve().parent / "lua"
_TICK = os.sysconf("SC_CLK_TCK")


def _procs() -> dict[int, tuple[str, int, int, int]]:
    """pid -> (command line, parent pid, CPU ticks, voluntary context switches)."""
    out = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmd = open(d + "/cmdline").read().replace("\0", " ")
            f = open(d + "/stat").read().rsplit(")", 1)[1].split()
            switches = 0
            if "gunicorn" in cmd:
                for line in open(d + "/status"):
                    if line.startswith("voluntary_ctxt_switches"):
                        switches = int(line.split()[1])
            out[int(d[6:])] = (cmd, int(f[1]), sum(int(x) for x in f[11:15]), switches)
        except (OSError, IndexError, ValueError):
            continue
    return out


def _cost(
    before: dict, after: dict, *, bind: str, postmaster: int, redis_port: str
) -> tuple[float, float, dict[str, float]]:
    """(CPU ms, gunicorn voluntary context switches, CPU ms by process: gunicorn,
    PostgreSQL, Redis) spent between the two snapshots by the gunicorn of `bind`, the
    PostgreSQL backends and Redis."""
    switches = 0
    by = {"gunicorn": 0, "PostgreSQL": 0, "Redis": 0}
    for pid, (cmd, ppid, cpu, vcs) in after.items():
        gunicorn_side = "gunicorn" in cmd and bind in cmd
        who = (
            "gunicorn"
            if gunicorn_side
            else "PostgreSQL"
            if ppid == postmaster
            else "Redis"
            if "redis-server" in cmd and redis_port in cmd
            else None
        )
        if who is None:
            continue
        old = before.get(pid)
        by[who] += cpu - (old[2] if old else 0)
        if gunicorn_side and old:
            switches += vcs - old[3]
    split = {k: v * 1000 / _TICK for k, v in by.items()}
    return sum(split.values()), switches, split


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--baseline", required=True, help="a commit of this repository")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args(argv)
    require_wrk()
    migrations = subprocess.run(
        ["git", "diff", "--quiet", args.baseline, "--", "*/migrations/*"], cwd=ROOT
    )
    if migrations.returncode != 0:
        sys.exit(f"ab_reads: {args.baseline} has other migrations than this checkout")
    report = Report()
    with tempfile.TemporaryDirectory(prefix="verity-ab-") as tmp:
        base_root = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base_root), args.baseline],
            cwd=ROOT,
            check=True,
        )
        try:
            results = _run(args, base_root)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_root)], cwd=ROOT)
    for side in ("baseline", "this checkout"):
        rows = results[side]
        floor = med([r[0] for r in rows["floor"]])
        floor_cpu = med([r[1] for r in rows["floor"]])
        for kind, label in (("replay", "replayed POST"), ("get", "GET /purchases/{id}")):
            rps = med([r[0] for r in rows[kind]])
            cpu = med([r[1] for r in rows[kind]])
            vcs = med([r[2] for r in rows[kind]])
            split = "/".join(
                f"{med([r[4][k] for r in rows[kind]]):.2f}"
                for k in ("gunicorn", "PostgreSQL", "Redis")
            )
            floor_split = "/".join(
                f"{med([r[4][k] for r in rows['floor']]):.2f}"
                for k in ("gunicorn", "PostgreSQL", "Redis")
            )
            note = (
                (f"{args.baseline} " if side == "baseline" else "")
                + f"CPU {cpu:.2f} ms/req (floor {floor_cpu:.2f}; gunicorn/PostgreSQL/Redis "
                f"{split}, floor {floor_split}), {vcs:.2f} sleeps/req; "
                f"p50 {med([r[3] for r in rows[kind]]):.1f} ms"
            )
            report.add(
                "ab reads",
                f"{side}: {label} req/s",
                fmt(rps),
                fmt(floor),
                f"{rps / floor:.2f}",
                ">= 0.60",
                note,
            )
    report.dump(args.json)
    report.print("replay and GET, baseline vs this checkout, one stack, interleaved")
    return report


def _run(args, base_root: Path) -> dict:
    with bench_stack() as (stack, env):
        from payments.models import Product

        Product.objects.create(
            sku="BENCH-1", name="Bench item", price=1500, currency="usd", stock=10**6
        )
        key = (
            manage(
                env,
                "create_api_client",
                "bench",
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
        auth = {"Authorization": f"Api-Key {key}"}
        redis_port = stack.env["REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
        with gunicorn(env, stack, root=base_root) as old, gunicorn(env, stack) as new:
            api = f"{new}/api/v1"
            st, quote = http_json(
                "POST",
                f"{api}/quotes",
                {"items": [{"sku": "BENCH-1", "quantity": 1}], "currency": "usd"},
                {**auth, "Idempotency-Key": "ab-quote"},
            )
            st, purchase = http_json(
                "POST",
                f"{api}/purchases",
                {
                    "quote_id": quote["id"],
                    "quote_version": quote["version"],
                    "customer": {"reference": "ab", "email": "ab@example.com"},
                },
                {**auth, "Idempotency-Key": "ab-purchase"},
            )
            pid = purchase["id"]
            body = {"payment_method": "pm_card_visa", "capture": "automatic"}
            st, _op = http_json(
                "POST",
                f"{api}/purchases/{pid}/payments",
                body,
                {**auth, "Idempotency-Key": "ab-pay"},
            )
            assert st == 201, st
            postmaster = next(
                p
                for p, (cmd, *_r) in _procs().items()
                if str(stack.tmp) in cmd
                and " -D " in f" {cmd} "
                and "postgres" in cmd.split(" ")[0]
            )
            replay_env = {
                "BENCH_AUTH": auth["Authorization"],
                "BENCH_IDEM_KEY": "ab-pay",
                "BENCH_BODY": json.dumps(body),
            }
            sides = {"baseline": old, "this checkout": new}
            results = {side: {"floor": [], "replay": [], "get": []} for side in sides}
            for rnd in range(args.rounds):
                for side, base in sides.items():
                    log(f"round {rnd + 1}/{args.rounds}: {side}")
                    cases = {
                        "floor": (f"{base}/bench-floor/purchase/{pid}", "get.lua", {}),
                        "replay": (
                            f"{base}/api/v1/purchases/{pid}/payments",
                            "same_post.lua",
                            replay_env,
                        ),
                        "get": (
                            f"{base}/api/v1/purchases/{pid}",
                            "get.lua",
                            {"BENCH_AUTH": auth["Authorization"]},
                        ),
                    }
                    for kind, (url, lua, wrk_env) in cases.items():
                        before = _procs()
                        r = wrk(
                            url,
                            LUA / lua,
                            seconds=args.seconds,
                            connections=args.connections,
                            env=wrk_env,
                        )
                        cpu, switches, split = _cost(
                            before,
                            _procs(),
                            bind=base.split("//")[1],
                            postmaster=postmaster,
                            redis_port=redis_port,
                        )
                        if r.non2xx or r.errors > 2:
                            log(f"{side} {kind}: {r.non2xx} non-2xx, {r.errors} errors")
                        n = max(r.requests, 1)
                        results[side][kind].append(
                            (
                                r.rps,
                                cpu / n,
                                switches / n,
                                r.p50_ms,
                                {k: v / n for k, v in split.items()},
                            )
                        )
    return results


if __name__ == "__main__":
    main()
