"""Helpers for the agent toolkit tests: a real MCP client talking to the real server."""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.factories import ProductFactory, make_client

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The test database, for a server subprocess (as tests/conftest.py's celery_worker)."""
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


test_database_url.__test__ = False  # a helper, not a test


def stdio_server_params(key: str, **env):
    """`python manage.py mcp_server` as the agent's host would launch it."""
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable, args=["manage.py", "mcp_server"], cwd=str(ROOT),
        env={**os.environ, "DATABASE_URL": test_database_url(), "VERITY_API_KEY": key,
             "FAULT_DRILLS_ENABLED": "true", **env})


class Transcript:
    """What the scripted agent saw, call by call (printed on failure)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict, dict]] = []

    async def call(self, client, name: str, **arguments) -> dict:
        result = await client.call_tool(name, arguments)
        data = result.structured_content
        assert data is not None, f"{name} returned no structured content: {result.content}"
        assert result.content and result.content[0].text.startswith(data["instruction"])
        assert result.is_error == (data["refusal"] is not None)
        self.calls.append((name, arguments, data))
        return data

    def __str__(self) -> str:
        return "\n".join(f"{n}({a}) -> {d['instruction']}" for n, a, d in self.calls)


@pytest.fixture
def product(db):
    return ProductFactory(price=2500, stock=50)


@pytest.fixture
def agent_key(db):
    _, key = make_client(scopes=("purchases:read", "purchases:write", "refunds:write"),
                         limit=1_000_000, name="agent")
    return key


@contextmanager
def relay_running(interval: float = 0.1):
    """Drain the outbox in a background thread while the agent runs.

    This is the code the `relay_drain` Celery task runs (recovery.relay), standing in for
    the session-scoped `celery_worker`: started from tests/agents (the first package
    alphabetically) that worker would keep draining every later package's outbox and
    race their own drains and database flushes.
    """
    from recovery.relay import relay_drain_once

    stop, errors = threading.Event(), []

    def loop() -> None:
        try:
            while not stop.is_set():
                if not relay_drain_once():
                    stop.wait(interval)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="test-relay", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
    if errors:
        raise errors[0]
