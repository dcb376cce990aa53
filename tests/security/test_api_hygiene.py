"""API answers carrying customer e-mails and status links are not cacheable,
and failed API-key authentications are throttled per address and per key prefix.
Effects counted: 401/429 answers, and whether a guess was still checked."""

import pytest
from rest_framework.test import APIClient

from tests.api.client import Api
from tests.factories import ProductFactory, make_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def limits(settings):
    settings.API_AUTH_FAILURES_PER_ADDRESS = 5
    settings.API_AUTH_FAILURES_PER_PREFIX = 8
    settings.API_AUTH_FAILURE_WINDOW_SECONDS = 900
    from django.core.cache import cache

    cache.delete_many(
        [f"api-auth-fail:ip:{a}" for a in ("127.0.0.1", "192.0.2.1", "192.0.2.2", "192.0.2.3")]
    )


def _guess(key: str, address: str = "127.0.0.1"):
    http = APIClient(REMOTE_ADDR=address)
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return http.get("/api/v1/products")


def test_purchase_answers_with_emails_and_status_links_are_not_stored():
    # given a purchase with a customer e-mail and a status link
    client, key = make_client(name="shop")
    api = Api(key, client)
    purchase = api.new_purchase(ProductFactory().sku)

    # when it is read
    answer = api.get(f"purchases/{purchase['id']}")

    # then nobody may cache it
    assert "buyer@example.com" in answer.content.decode()
    assert "/status/" in answer.content.decode()
    assert answer["Cache-Control"] == "no-store"


def test_failed_api_keys_are_throttled_per_address(limits):
    # given an address that sent five wrong keys
    answers = [_guess(f"guess{i}.not-a-secret") for i in range(5)]

    # when it keeps guessing; then 429, while another address is still answered 401
    assert [a.status_code for a in answers] == [401] * 5
    refused = _guess("guess9.not-a-secret")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert _guess("guessX.not-a-secret", address="192.0.2.1").status_code == 401


def test_failed_api_keys_are_throttled_per_key_prefix(limits):
    # given wrong secrets for one client's key prefix, from many addresses
    client, key = make_client(name="target")
    prefix = key.split(".", 1)[0]
    for i in range(8):
        assert _guess(f"{prefix}.wrong{i}", address=f"198.51.100.{i}").status_code == 401

    # when another address tries that prefix; then refused before checking the secret
    assert _guess(f"{prefix}.wrong-again", address="203.0.113.5").status_code == 429
    # another client's key is unaffected
    _, other = make_client(name="bystander")
    assert _guess(other, address="203.0.113.5").status_code == 200
