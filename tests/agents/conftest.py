"""Fixtures for the agent toolkit tests: an agent's API key and the MCP server's URL (the
host that launches the server over stdio: tests/agents/mcp_host.py)."""

from __future__ import annotations

import pytest

from tests.factories import make_client


@pytest.fixture
def agent_key(db):
    _, key = make_client(
        scopes=("purchases:read", "purchases:write", "refunds:write"), limit=1_000_000, name="agent"
    )
    return key


@pytest.fixture
def mcp_url(live_server, settings):
    from django.urls import Resolver404, resolve

    try:
        resolve("/mcp/")  # config/urls.py mounts agents.urls
    except Resolver404:
        settings.ROOT_URLCONF = "tests.agents.urls"
    return f"{live_server.url}/mcp/"
