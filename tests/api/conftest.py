"""Storefront API fixtures: API clients with keys (the client itself: tests/api/client.py)."""

from __future__ import annotations

import pytest

from tests.api.client import ALL_SCOPES, Api
from tests.factories import make_client


@pytest.fixture
def other_storefront(db):
    client, key = make_client(scopes=ALL_SCOPES, limit=10_000_000, name="other")
    return Api(key, client)


@pytest.fixture
def reader(db):
    client, key = make_client(scopes=("purchases:read",), name="reader")
    return Api(key, client)


@pytest.fixture
def ops_tool(db):
    client, key = make_client(
        scopes=("purchases:read", "purchases:write", "operations:resolve"), name="ops-tool"
    )
    return Api(key, client)
