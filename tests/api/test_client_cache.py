"""The verified-client cache (payments.client_cache) hands each request its own copy of
the cached ApiClient: a request that changes its instance, or caches a relation on it,
changes nothing for the next request."""

import pytest

from payments.client_cache import api_client_cached, api_client_verified
from tests.factories import make_client

pytestmark = pytest.mark.django_db


def test_a_cached_client_is_each_requests_own_copy(settings):
    settings.API_CLIENT_CACHE_SECONDS = 60
    client, key = make_client(name="cache-copy")
    assert api_client_verified(key).pk == client.pk

    first, second = api_client_cached(key), api_client_cached(key)
    first.name = "changed in one request"
    first._state.fields_cache["related"] = object()
    third = api_client_cached(key)

    assert first is not second and first is not third
    assert (second.pk, third.pk) == (client.pk, client.pk)
    assert third.name == "cache-copy" and "related" not in third._state.fields_cache
    assert (third._state.adding, third._state.db) == (False, "default")
    assert third.has_scope("purchases:read") == client.has_scope("purchases:read")
