"""Before `make run` starts anything: is each loopback port it needs free?

    python -m tools.dev_ports web=8000 localstripe=8420 [chain=8545 facilitator=8402]

Exit 0 when all are free. Otherwise name each taken port, what `make run` needs it for and
the variable that moves it (with a port that is free now), and exit 2: nothing is started,
so nothing is left running (a server that cannot bind would otherwise take the others down
with it after the demo data was seeded and the links printed).
"""

from __future__ import annotations

import errno
import socket
import sys

# service -> (what it is to a newcomer, the variable `make run` reads for its port)
SERVICES = {
    "web": ("the console, the API and the status pages", "VERITY_PORT"),
    "localstripe": ("localstripe, the local stand-in for Stripe", "LOCALSTRIPE_PORT"),
    "chain": ("the local x402 chain (anvil)", "X402_CHAIN_PORT"),
    "facilitator": ("the local x402 facilitator", "X402_FACILITATOR_PORT"),
}


def taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could not bind host:port now (as gunicorn and the others bind:
    SO_REUSEADDR, so a closed connection in TIME_WAIT does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def a_free_port_after(port: int, avoid: set[int]) -> int | None:
    for candidate in range(port + 1, min(port + 100, 65536)):
        if candidate not in avoid and not taken(candidate):
            return candidate
    return None


def main(argv: list[str]) -> int:
    wanted = {}
    for arg in argv:
        name, _, port = arg.partition("=")
        if name not in SERVICES or not port.isdigit():
            print(
                f"usage: python -m tools.dev_ports NAME=PORT ... (NAME: "
                f"{', '.join(SERVICES)}); got {arg!r}",
                file=sys.stderr,
            )
            return 64
        wanted[name] = int(port)
    busy = {name: port for name, port in wanted.items() if taken(port)}
    if not busy:
        return 0
    lines = []
    moves = []
    for name, port in busy.items():
        what, variable = SERVICES[name]
        lines.append(f"Port {port} is already in use, and `make run` needs it for {what}.")
        free = a_free_port_after(port, set(wanted.values()))
        moves.append(f"{variable}={free if free else '<another port>'}")
    print(
        "\n".join(
            [
                "",
                *lines,
                "Another program (or an earlier `make run` still running) holds it; "
                f"`ss -ltnp 'sport = :{next(iter(busy.values()))}'` shows which.",
                "Stop it, or choose another port for this run:",
                f"    make run {' '.join(moves)}",
                "Nothing was started.",
                "",
            ]
        ),
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
