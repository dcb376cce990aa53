"""The early webhook path under a real HTTP server: two gunicorns
on the test database, one with the shipped settings (early path), one with the early
middleware removed (tests/webhooks/whole_chain_settings.py, the whole chain). Raw HTTP/1.x
bytes — chunked bodies without Content-Length, HTTP/1.0, Expect: 100-continue, two requests
on one kept-alive connection, an empty Cookie header, an oversized body — must give the same
answer bytes (Date aside) and the same rows; then many concurrent duplicate deliveries
against each server (gthread workers) store one event and one outbox row."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from django.conf import settings

from recovery.models import OutboxMessage
from tests.webhooks.events import event_for, intent_object, sign
from webhooks.models import ProviderEvent

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_early_webhook_gunicorn"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def servers():
    db = settings.DATABASES["default"]
    url = (
        f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    )
    procs, ports = [], {}
    for name, module in (
        ("early", "config.settings"),
        ("chain", "tests.webhooks.whole_chain_settings"),
    ):
        port = _free_port()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": module,
            "DATABASE_URL": url,
            "STRIPE_WEBHOOK_SECRETS": SECRET,
            "DATA_UPLOAD_MAX_MEMORY_SIZE": "4096",
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "config.wsgi:application",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    "1",
                    "--worker-class",
                    "gthread",
                    "--threads",
                    "8",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        ports[name] = port
    try:
        deadline = time.monotonic() + 90
        for port in ports.values():
            while True:
                try:
                    requests.get(f"http://127.0.0.1:{port}/healthz", timeout=20)
                    break
                except requests.RequestException:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
        yield ports
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def _body(event_id: str) -> bytes:
    return json.dumps(
        event_for(
            intent_object(
                pi_id="pi_r7g", status="succeeded", amount=1500, metadata={"purchase_id": "pur_r7g"}
            ),
            "payment_intent.succeeded",
            event_id=event_id,
        )
    ).encode()


def _raw(port: int, data: bytes, *, expect_continue: bool = False) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        if expect_continue:
            head, _, rest = data.partition(b"\r\n\r\n")
            s.sendall(head + b"\r\n\r\n")
            time.sleep(0.3)
            s.sendall(rest)
        else:
            s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return re.sub(rb"(?im)^date: [^\r\n]*\r\n", b"", out)


CASES = (
    "content-length",
    "chunked",
    "http/1.0 no length",
    "expect 100-continue",
    "empty cookie",
    "kept alive twice",
    "oversized",
    "oversized chunked",
)


def _request(case: str, port: int, event_id: str) -> bytes:
    body = _body(event_id)
    if case.startswith("oversized"):
        body = body + b" " * 5000  # JSON still; over DATA_UPLOAD_MAX_MEMORY_SIZE (4096)
    sig = sign(body, SECRET).encode()
    host = f"127.0.0.1:{port}".encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    base = (
        b"POST /webhooks/stripe/ HTTP/1.1\r\nHost: "
        + host
        + b"\r\nContent-Type: application/json\r\nStripe-Signature: "
        + sig
        + b"\r\n"
    )
    length = b"Content-Length: %d\r\n" % len(body)
    close = b"Connection: close\r\n\r\n"
    return {
        "content-length": base + length + close + body,
        "chunked": base + b"Transfer-Encoding: chunked\r\n" + close + chunked,
        "http/1.0 no length": base.replace(b"HTTP/1.1", b"HTTP/1.0") + b"\r\n" + body,
        "expect 100-continue": base + b"Expect: 100-continue\r\n" + length + close + body,
        "empty cookie": base + b"Cookie: \r\n" + length + close + body,
        "kept alive twice": base + length + b"\r\n" + body + base + length + close + body,
        "oversized": base + length + close + body,
        "oversized chunked": base + b"Transfer-Encoding: chunked\r\n" + close + chunked,
    }[case]


def _metrics(port: int) -> dict:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=20).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("verity_webhook_") and "_total" in line
    }


def _rows(prefix: str) -> tuple:
    return (
        ProviderEvent.objects.filter(event_id__startswith=prefix).count(),
        OutboxMessage.objects.filter(dedupe_key__startswith=f"event:{prefix}").count(),
    )


def test_raw_http_answers_and_rows_are_the_same_under_gunicorn(servers):
    answers = {}
    for name, port in servers.items():
        before = _metrics(port)
        answers[name] = {}
        for n, case in enumerate(CASES):
            # one event id per case and server: each case stores (or not) on its own
            answers[name][case] = _raw(
                port,
                _request(case, port, f"evt_r7g_{name}_{n}"),
                expect_continue=case == "expect 100-continue",
            )
        after = _metrics(port)
        answers[name]["metrics"] = {
            k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)
        }
        answers[name]["rows"] = _rows(f"evt_r7g_{name}_")
    for case in answers["early"]:
        print(case, "\n early", answers["early"][case], "\n chain", answers["chain"][case])
    host_free = {
        n: {
            c: a.replace(str(servers[n]).encode(), b"PORT") if isinstance(a, bytes) else a
            for c, a in v.items()
        }
        for n, v in answers.items()
    }
    assert host_free["early"] == host_free["chain"]
    # stored: content-length, 100-continue, empty cookie, kept-alive (once, then duplicate).
    # Without Content-Length (chunked, HTTP/1.0) Django reads an empty body under gunicorn:
    # refused 400 on both paths alike; the oversized ones are 400 too.
    assert answers["early"]["rows"] == answers["chain"]["rows"] == (4, 4)


@pytest.mark.parametrize("name", ["early", "chain"])
def test_concurrent_duplicates_against_gunicorn_store_once(servers, name):
    port = servers[name]
    event_id = f"evt_r7g_race_{name}"
    body = _body(event_id)
    sig = sign(body, SECRET)
    before = _metrics(port)
    barrier = threading.Barrier(16)
    answers = [None] * 16

    def run(i):
        barrier.wait(10)
        answers[i] = requests.post(
            f"http://127.0.0.1:{port}/webhooks/stripe/",
            data=body,
            headers={"Stripe-Signature": sig, "Content-Type": "application/json"},
            timeout=30,
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert [a.status_code for a in answers] == [200] * 16
    assert sorted(a.json()["duplicate"] for a in answers) == [False] + [True] * 15
    assert _rows(event_id) == (1, 1)
    after = _metrics(port)
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert delta == {
        'verity_webhook_results_total{result="received"}': 1.0,
        'verity_webhook_results_total{result="duplicate"}': 15.0,
    }
