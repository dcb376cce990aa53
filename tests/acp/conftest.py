"""ACP fixtures. The agent platform's API client (`platform`, scope `acp`), the HTTP agent
speaking the protocol (`acp_agent`) and the product it buys (`tea`) are shared
(tests/fixtures.py: other folders buy over ACP too); the agent's client is
tests/acp/agent.py, the payment tokens tests/acp/tokens.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def agent(acp_agent):
    """The ACP agent (tests/fixtures.py's `acp_agent`), by its short name in this folder."""
    return acp_agent
