"""Indexes for the console's purchases list (support.purchase_list): newest first under a
status or an amount (a rare status or an amount no purchase has must not walk every
purchase by date), and an ACP buyer's name found by any part of it (a trigram index on
the same expression as support.purchase_list.BuyerName).

PostgreSQL only, model state unchanged (the embedded SQLite of `make run` has neither
pg_trgm nor GIN; its list is small). On a large live table create them CONCURRENTLY by hand
first: IF NOT EXISTS then makes this a no-op. pg_trgm is a trusted extension (PostgreSQL
13+): the database owner may create it.
"""
from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations


INDEXES = [
    ("purchase_status_created_idx",
     "CREATE INDEX IF NOT EXISTS purchase_status_created_idx "
     "ON payments_purchase (status, created_at)"),
    ("purchase_amount_created_idx",
     "CREATE INDEX IF NOT EXISTS purchase_amount_created_idx "
     "ON payments_purchase (amount, created_at)"),
    # The same SQL as support.purchase_list.BuyerName (change both together).
    ("acp_session_buyer_name_trgm_idx",
     "CREATE INDEX IF NOT EXISTS acp_session_buyer_name_trgm_idx ON acp_checkoutsession "
     "USING gin ((UPPER(COALESCE(buyer->>'full_name', '') || ' ' || "
     "COALESCE(buyer->>'first_name', '') || ' ' || COALESCE(buyer->>'last_name', ''))) "
     "gin_trgm_ops)"),
]


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for _, sql in INDEXES:
        schema_editor.execute(sql)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _ in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("support", "0006_form_submission_once"),
        ("payments", "0013_covering_indexes_for_money_at_risk"),
        ("acp", "0002_agent_platform"),
    ]

    operations = [TrigramExtension(), migrations.RunPython(create, drop)]
