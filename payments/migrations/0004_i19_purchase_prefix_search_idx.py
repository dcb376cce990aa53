"""Indexes for the console's prefix search (support.selectors.search): a partial
customer reference (`customer_reference LIKE 'q%'`) or e-mail
(`UPPER(customer_email::text) LIKE UPPER('q%')`, Django's `istartswith`).

A plain btree serves LIKE prefixes only under the C collation; the pattern-ops classes
make it work under any collation. PostgreSQL only (the embedded SQLite of `make run` has
no operator classes): model state unchanged. On a large live table create them
CONCURRENTLY by hand first (IF NOT EXISTS then makes this a no-op).
"""
from django.db import migrations

INDEXES = [
    ("purchase_ref_prefix_idx",
     "payments_purchase (customer_reference varchar_pattern_ops)"),
    ("purchase_email_prefix_idx",
     "payments_purchase ((UPPER(customer_email::text)) text_pattern_ops)"),
]


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, target in INDEXES:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {target}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _ in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("payments", "0004_i15a_duplicate_and_overturn")]

    operations = [migrations.RunPython(create, drop)]
