"""What an agent's host does with the MCP server: launch it over stdio as a host would
(stdio_server_params) and keep what the agent saw, call by call (Transcript)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The test database, for a server subprocess (as tests/fixtures.py's celery_worker)."""
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


test_database_url.__test__ = False  # a helper, not a test


def stdio_server_params(key: str, **env):
    """`python manage.py mcp_server` as the agent's host would launch it."""
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "mcp_server"],
        cwd=str(ROOT),
        env={
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "VERITY_API_KEY": key,
            "FAULT_DRILLS_ENABLED": "true",
            **env,
        },
    )


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
