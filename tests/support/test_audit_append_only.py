"""Audit, resolution and note rows are append-only, enforced by PostgreSQL itself:
neither the ORM nor raw SQL from the application's connection can change them."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from support.models import AuditEntry, Note, Resolution


@pytest.fixture
def rows(users):
    audit = AuditEntry.objects.create(
        actor="olga",
        action="console.resolve",
        target_type="operation",
        target_id="op_1",
        reason="provider dashboard shows paid",
        ip="10.0.0.1",
    )
    resolution = Resolution.objects.create(
        operation_id="op_1", purchase_id="pur_1", outcome="succeeded", reason="seen", actor="olga"
    )
    note = Note.objects.create(purchase_id="pur_1", author=users["support"], body="called")
    return [audit, resolution, note]


def _refused(fn):
    with pytest.raises(DatabaseError) as excinfo, transaction.atomic():
        fn()
    assert "append-only" in str(excinfo.value)


def test_orm_update_and_delete_are_refused(rows):
    for row in rows:
        model = type(row)
        rows_of = model.objects.filter(pk=row.pk)
        _refused(lambda rows_of=rows_of, row=row: rows_of.update(created_at=row.created_at))
        _refused(lambda rows_of=rows_of: rows_of.delete())
        _refused(row.delete)
        assert model.objects.filter(pk=row.pk).exists()
    assert AuditEntry.objects.get(pk=rows[0].pk).reason == "provider dashboard shows paid"


def test_raw_sql_update_and_delete_are_refused(rows):
    for row in rows:
        table = type(row)._meta.db_table

        def update(table=table, pk=row.pk):
            with connection.cursor() as cur:
                cur.execute(f"UPDATE {table} SET created_at = now() WHERE id = %s", [pk])

        def delete(table=table, pk=row.pk):
            with connection.cursor() as cur:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", [pk])

        _refused(update)
        _refused(delete)
    assert AuditEntry.objects.count() == 1


def test_saving_an_existing_row_is_refused(rows):
    audit = rows[0]
    audit.reason = "rewritten"
    _refused(audit.save)
    assert AuditEntry.objects.get(pk=audit.pk).reason == "provider dashboard shows paid"
