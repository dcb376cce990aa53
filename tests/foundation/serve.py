"""`make serve` as the newcomer tests boot it: the environment of a person's shell (the test
stack's variables removed), free loopback ports, a temporary var/; and what it left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
# What `make test`'s stack sets and the embedded default must not see.
STACK_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "STRIPE_API_KEY",
    "STRIPE_API_BASE",
    "VERITY_STACK_DIR",
    "MAKEFLAGS",
    "MAKELEVEL",
    "MFLAGS",
)
PORT_VARIABLES = {
    "web": "VERITY_PORT",
    "localstripe": "LOCALSTRIPE_PORT",
    "chain": "X402_CHAIN_PORT",
    "facilitator": "X402_FACILITATOR_PORT",
}


def serve_env(var: Path) -> dict[str, str]:
    """The test process's environment less the stack's, each port free, var/ at `var`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in STACK_VARIABLES and not k.startswith("X402_")
    }  # tests.stack --x402's
    env.update({name: str(free_port()) for name in PORT_VARIABLES.values()})
    web, ls = env["VERITY_PORT"], env["LOCALSTRIPE_PORT"]
    env.update(
        {
            "VERITY_VAR_DIR": str(var),
            "STRIPE_API_BASE": f"http://127.0.0.1:{ls}",
            "PUBLIC_BASE_URL": f"http://127.0.0.1:{web}",
            "STOREFRONT_CHECKOUT_URL": f"http://127.0.0.1:{web}/demo-checkout/{{purchase_id}}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def processes_of(var: Path) -> list[str]:
    """Every process still running with this var/ in its environment (each process
    `make serve` starts inherits it, whatever session it moved to): "pid command"."""
    marker = f"VERITY_VAR_DIR={var}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes() + b"\0":
                cmd = (
                    (entry / "cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode(errors="replace")
                    .strip()
                )
                state = next(
                    (
                        line
                        for line in (entry / "status").read_text().splitlines()
                        if line.startswith("State:")
                    ),
                    "",
                )
                if "zombie" not in state:
                    found.append(f"{entry.name} {cmd}")
    return found


def stop(proc: subprocess.Popen, var: Path | None = None) -> None:
    """Ctrl-C as a person would (to the foreground process group), then make sure; with
    `var`, also whatever escaped the group (so a failing test leaves nothing behind)."""
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group
    if var is not None:
        for line in processes_of(var):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
