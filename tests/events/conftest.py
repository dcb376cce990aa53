"""Storefront events fixtures: a receiver that verifies with the stock `standardwebhooks`
verifier, and a storefront allowed to manage its webhook endpoints."""

from __future__ import annotations

import pytest

from tests.api.client import ALL_SCOPES, Api
from tests.events.receiver import Receiver
from tests.factories import make_client


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def loopback_allowed(settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    settings.EVENTS_FEED_SETTLE_SECONDS = 0
    settings.WEBHOOK_RETRY_SCHEDULE_SECONDS = [0.05, 0.1, 0.2]
    settings.WEBHOOK_READ_TIMEOUT_SECONDS = 0.5
    settings.WEBHOOK_CONNECT_TIMEOUT_SECONDS = 0.5
    return settings


@pytest.fixture
def worker_env(monkeypatch, loopback_allowed):
    # A worker is another process: it reads these from its environment.
    monkeypatch.setenv("WEBHOOK_ALLOW_LOOPBACK", "true")
    monkeypatch.setenv("WEBHOOK_RETRY_SCHEDULE_SECONDS", "0.2,0.5,1")
    monkeypatch.setenv("EVENTS_FEED_SETTLE_SECONDS", "0")


@pytest.fixture
def shop(db):
    client, key = make_client(
        scopes=(*ALL_SCOPES, "webhooks:manage"),
        limit=10_000_000,
        name="shop",
        auto_refund_limit=100_000,
    )
    return Api(key, client)
