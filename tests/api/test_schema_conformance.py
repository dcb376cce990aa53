"""Schemathesis against /api/schema/: no 5xx, and every answer matches the schema.

Bounded and reproducible for CI: a fixed seed, deterministic generation, at most 5
generated examples per operation plus the schema's own examples; the coverage and
stateful phases are off. Every other case swaps the generated path id for a real one of
the caller's, so the operations are exercised beyond 404.
"""

from __future__ import annotations

import itertools
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from config.wsgi import application
from events.models import WebhookEndpoint
from tests.api.client import ALL_SCOPES, Api
from tests.factories import ProductFactory, make_client
from tests.outbox import settle_outbox

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 20261130,
        "generation": {"max-examples": 5, "deterministic": True, "mode": "all"},
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    }
)
schema = schemathesis.openapi.from_wsgi("/api/schema/", application, config=CONFIG)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


class World:
    def __init__(self) -> None:
        # The schema's examples name TEA-001; make it exist so they reach real code.
        ProductFactory(sku="TEA-001", price=1250, stock=10_000)
        client, key = make_client(
            scopes=ALL_SCOPES + ("operations:resolve", "webhooks:manage"),
            name="fuzzer",
            auto_refund_limit=100_000,
        )
        self.auth = {"Authorization": f"Api-Key {key}"}
        api = Api(key, client)
        self.open_purchase = api.new_purchase("TEA-001")["id"]
        paid = api.new_purchase("TEA-001")["id"]
        self.operation = api.pay(paid).json()["id"]
        self.endpoint = WebhookEndpoint.objects.create(
            api_client_id=client.pk, url="https://receiver.example/hooks"
        ).id
        self._turn = itertools.count()

    def ids(self, path_parameters: dict) -> dict:
        if next(self._turn) % 2:
            return path_parameters
        out = dict(path_parameters)
        if "purchase_id" in out:
            out["purchase_id"] = self.open_purchase
        if "operation_id" in out:
            out["operation_id"] = self.operation
        if "endpoint_id" in out:
            out["endpoint_id"] = self.endpoint
        return out


@pytest.fixture
def world(transactional_db, localstripe, settings):
    settings.EVENTS_WAIT_MAX_SECONDS = 0.2  # the feed's long-poll, bounded for the fuzzer
    yield World()
    settle_outbox()


@schema.parametrize()
# CI's budget is 5 examples per operation; `make fuzz` raises it (VERITY_FUZZ_EXAMPLES).
@settings(
    max_examples=int(os.environ.get("VERITY_FUZZ_EXAMPLES", "5")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@pytest.mark.django_db(transaction=True)
def test_api_conforms_to_its_schema(case, world):
    if case.path_parameters:
        case.path_parameters = world.ids(case.path_parameters)
    case.call_and_validate(headers=world.auth, checks=CHECKS)
