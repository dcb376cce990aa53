"""Status tokens (customers' credentials) never reach a log line — neither
Django's (a 405 or a refused pay-again on a status URL is logged at WARNING with its path)
nor gunicorn's access log. Effects counted: the process's real log output, scanned."""

import io
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.conf import settings

from tests.factories import PurchaseFactory

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def console_output():
    """What the LOGGING `console` handler writes (the process's log output)."""
    handler = next(h for h in logging.getLogger().handlers if h.get_name() == "console")
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    yield buffer
    handler.setStream(previous)


def test_django_request_warnings_do_not_carry_status_tokens(client, console_output):
    # given a customer's status link
    token = PurchaseFactory().status_token

    # when requests on it are refused (405 on the page, pay-again not allowed)
    refused = client.delete(f"/status/{token}/")
    again = client.post(f"/status/{token}/pay-again")

    # then the warnings were logged, with the token redacted
    output = console_output.getvalue()
    assert refused.status_code == 405 and again.status_code >= 400
    assert "Method Not Allowed" in output and "/status/‹token›/" in output
    assert token not in output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gunicorn_access_log_does_not_carry_status_tokens():
    # given Verity under gunicorn as `make run` starts it (access log on stdout)
    token = "T" * 12 + "o" * 12 + "k" * 8  # the shape of a status token
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--access-logfile",
            "-",
        ],
        cwd=ROOT,
        env={**os.environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                requests.get(f"http://127.0.0.1:{port}/healthz", timeout=20)
                break
            except requests.RequestException:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.2)

        # when a status page is requested (with a status link as referer, too)
        requests.get(
            f"http://127.0.0.1:{port}/status/{token}/",
            timeout=30,
            headers={"Referer": f"{settings.PUBLIC_BASE_URL}/status/{token}/"},
        )
    finally:
        server.terminate()
        output = server.communicate(timeout=20)[0].decode()

    # then the access log has the request, with the token redacted
    assert "/status/‹token›/" in output, output
    assert token not in output
