"""A process that never touches the x402 rail or the MCP endpoint does not import web3, the
x402 SDK's EVM mechanisms or the MCP SDK: they were about half of every Django process's
start (2.4 s of CPU for `manage.py check`, 1.2 s without them), paid by each gunicorn and
Celery worker and each `manage.py` command. The rail loads them on first use
(payments/providers/x402/sdk.py), without ever raising the interpreter's recursion limit
that py_ecc raises at import (deep JSON must stay a RecursionError, not a crash)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SETUP = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
from django.urls import get_resolver
get_resolver().url_patterns  # every view module, as the first request loads them
import payments.services, support.services, recovery.services, events.services  # noqa
"""


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _SETUP + code],
        cwd=ROOT,
        env={**os.environ, "DEBUG": "true"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_app_and_its_urls_load_without_web3_the_x402_sdk_or_mcp():
    out = _python(
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('web3', 'eth_account', 'py_ecc', 'mcp') or m.startswith('x402.mechanisms'))\n"
        "print(heavy)"
    )
    assert out.strip() == "[]", out


def test_the_sdk_loads_on_first_use_without_raising_the_recursion_limit():
    # A thread watches the limit while another loads the SDK, as a gunicorn worker's
    # threads would while one of them serves the first x402 request.
    out = _python(
        """
import threading
from payments.providers.x402 import sdk
before, seen, done = sys.getrecursionlimit(), set(), threading.Event()
def watch():
    while not done.is_set():
        seen.add(sys.getrecursionlimit())
t = threading.Thread(target=watch)
t.start()
address = sdk.Web3.to_checksum_address("0x" + "ab" * 20)
done.set()
t.join()
print(before, sorted(seen), sys.getrecursionlimit(), "web3" in sys.modules, address)
"""
    )
    before, seen, after, loaded, address = out.split(" ", 4)
    assert (seen, after, loaded) == (f"[{before}]", before, "True"), out
    assert address.strip() == "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"
