"""The OpenAPI document: every endpoint, its problems, the key header, examples."""

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

ENDPOINTS = {
    ("get", "/api/v1/products"),
    ("post", "/api/v1/quotes"),
    ("post", "/api/v1/purchases"),
    ("get", "/api/v1/purchases/{purchase_id}"),
    ("get", "/api/v1/purchases/{purchase_id}/deliverable"),
    ("post", "/api/v1/purchases/{purchase_id}/payments"),
    ("post", "/api/v1/purchases/{purchase_id}/capture"),
    ("post", "/api/v1/purchases/{purchase_id}/void"),
    ("post", "/api/v1/purchases/{purchase_id}/cancel"),
    ("post", "/api/v1/purchases/{purchase_id}/refunds"),
    ("get", "/api/v1/operations/{operation_id}"),
    ("post", "/api/v1/operations/{operation_id}/reconcile"),
    ("post", "/api/v1/operations/{operation_id}/replay"),
    ("post", "/api/v1/operations/{operation_id}/resolve"),
    ("post", "/api/v1/operations/{operation_id}/decline"),
    ("get", "/api/v1/clients/me/limits"),
    ("get", "/api/v1/purchases"),
    ("get", "/api/v1/events"),
    ("get", "/api/v1/webhook-endpoints"),
    ("post", "/api/v1/webhook-endpoints"),
    ("get", "/api/v1/webhook-endpoints/{endpoint_id}"),
    ("patch", "/api/v1/webhook-endpoints/{endpoint_id}"),
    ("delete", "/api/v1/webhook-endpoints/{endpoint_id}"),
    ("post", "/api/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
    ("get", "/api/v1/webhook-endpoints/{endpoint_id}/deliveries"),
}
KEYLESS_POSTS = {"/api/v1/operations/{operation_id}/reconcile"}


@pytest.fixture
def document():
    r = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200
    return r.json()


def test_every_endpoint_is_documented_with_problems_and_key_header(document):
    found = {(method, path) for path, item in document["paths"].items() for method in item}
    assert found == ENDPOINTS
    assert document["components"]["securitySchemes"]["ApiKey"]["name"] == "Authorization"
    for method, path in ENDPOINTS:
        op = document["paths"][path][method]
        assert op.get("summary"), (method, path)
        responses = op["responses"]
        for status in ("400", "401", "403", "404", "429"):
            assert "application/problem+json" in responses[status]["content"], (path, status)
        headers = {p["name"] for p in op.get("parameters", []) if p["in"] == "header"}
        if method == "post" and path not in KEYLESS_POSTS:
            assert "Idempotency-Key" in headers, path
            assert "200" in responses  # the replay answer
        ok = [s for s in responses if s.startswith("2")]
        assert ok and all(
            "application/json" in responses[s]["content"] for s in ok if s != "204"
        )  # a 204 has no body


def test_payments_document_the_unknown_answer_and_examples(document):
    op = document["paths"]["/api/v1/purchases/{purchase_id}/payments"]["post"]
    assert {"200", "201", "202", "402", "409", "422", "503"} <= set(op["responses"])
    unknown = op["responses"]["202"]["content"]["application/json"]["examples"]
    [example] = unknown.values()
    assert example["value"]["next_action"]["retry"] == "forbidden"
    assert op["requestBody"]["content"]["application/json"]["examples"]


def test_docs_page_is_served():
    r = APIClient().get("/api/docs/")
    assert r.status_code == 200 and b"swagger" in r.content.lower()
