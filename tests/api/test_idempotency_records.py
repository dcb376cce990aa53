"""Key records: retention purge, and the record's life through one request."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from payments.models import IdempotencyRecord
from tests.api.client import new_key

pytestmark = pytest.mark.django_db


def test_purge_deletes_only_finished_records_past_retention(storefront, product):
    old_key, new, running = new_key(), new_key(), new_key()
    for key in (old_key, new):
        assert storefront.quote(product.sku, key=key).status_code == 201
    IdempotencyRecord.objects.filter(key=old_key).update(
        created_at=timezone.now() - timedelta(days=31)
    )
    IdempotencyRecord.objects.create(
        api_client=storefront.client,
        route="quotes_create",
        key=running,
        fingerprint="x",
        lease_until=timezone.now() + timedelta(seconds=30),
    )
    IdempotencyRecord.objects.filter(key=running).update(
        created_at=timezone.now() - timedelta(days=31)
    )

    call_command("idempotency_purge", "--days", "30")

    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == {new, running}
    # After the purge the old key is free again: a new effect, not a replay.
    r = storefront.quote(product.sku, key=old_key)
    assert r.status_code == 201 and not r.has_header("Idempotent-Replayed")


def test_a_finished_record_names_its_resource(storefront, product):
    key = new_key()
    quote = storefront.quote(product.sku, key=key).json()
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.state, record.resource_type, record.resource_id, record.response_status) == (
        "done",
        "quote",
        quote["id"],
        201,
    )
    assert record.route == "quotes_create" and record.api_client_id == storefront.client.pk
