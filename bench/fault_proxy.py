"""A TCP proxy in front of the provider, for the soak's provider faults.

`down()` closes the listening socket and every open connection: new connections are
refused (the request provably never left: `not_sent`), requests in flight are reset.
`up()` listens again on the same port. `hold(seconds)` delays every answer on its way
back, which widens the window between "the provider applied it" and "Verity recorded
it" — the soak kills a web process inside that window. `drop_answers(rate)` forwards each
request upstream and then, for a seeded share of connections, resets the connection
instead of passing the answer back: the upstream acted, the caller never hears of it.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time

from tests.stack import free_port


class FaultProxy:
    def __init__(self, upstream_port: int, *, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.hold_seconds = 0.0
        self.drop_rate = 0.0
        self.dropped = 0
        self._rng = random.Random(seed)
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 10
        while True:
            try:
                sock.bind(("127.0.0.1", self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        sock.listen(512)
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                conn.close()

    def hold(self, seconds: float) -> None:
        self.hold_seconds = seconds

    def drop_answers(self, rate: float) -> None:
        self.drop_rate = rate

    def _drop_this(self) -> bool:
        with self._lock:
            if self.drop_rate and self._rng.random() < self.drop_rate:
                self.dropped += 1
                return True
            return False

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), 5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    client.close()
                    upstream.close()
                    continue
                self._conns.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        decided = False
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if answers and self.hold_seconds:
                    time.sleep(self.hold_seconds)
                if answers and not decided:
                    decided = True  # one decision per connection, at its first answer bytes
                    if self._drop_this():
                        # The request reached upstream and was answered: reset the caller.
                        dst.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                        )
                        break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
                with self._lock:
                    self._conns.discard(s)
