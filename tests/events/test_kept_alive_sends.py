"""The webhook POST keeps its connection alive per checked destination: sends to one
receiver reuse one TCP connection (counted at the receiver, by the client port it sees),
every send is still address-checked first, and an answer longer than the read bound
closes its connection instead of leaving unread bytes on a reused one."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from events.destinations import pools_close, post_checked


class KeepAliveReceiver:
    def __init__(self, answer_bytes: int = 0) -> None:
        self.client_ports: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.client_ports.append(self.client_address[1])
                self.send_response(200)
                self.send_header("Content-Length", str(answer_bytes))
                self.end_headers()
                self.wfile.write(b"x" * answer_bytes)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"


@pytest.fixture
def loopback(settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    pools_close()
    yield settings
    pools_close()


def _send(url: str, n: int) -> list:
    return [
        post_checked(url, body=b'{"n":%d}' % i, headers={"webhook-id": f"msg_{i}"})
        for i in range(n)
    ]


def test_sends_to_one_receiver_reuse_one_connection(loopback):
    receiver = KeepAliveReceiver()
    results = _send(receiver.url, 5)
    assert all(r.ok for r in results)
    assert len(receiver.client_ports) == 5
    assert len(set(receiver.client_ports)) == 1


def test_a_long_answer_closes_its_connection(loopback):
    receiver = KeepAliveReceiver(answer_bytes=loopback.WEBHOOK_RESPONSE_BYTES * 3)
    results = _send(receiver.url, 3)
    assert all(r.ok for r in results)
    assert len(set(receiver.client_ports)) == 3


def test_a_kept_connection_does_not_skip_the_address_check(loopback):
    receiver = KeepAliveReceiver()
    assert _send(receiver.url, 1)[0].ok
    loopback.WEBHOOK_ALLOW_LOOPBACK = False  # the destination is refused from now on
    refused = _send(receiver.url, 1)[0]
    assert refused.status is None and refused.error.startswith("refused")
    assert len(receiver.client_ports) == 1
