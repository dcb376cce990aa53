"""The outbox drain, with millions of processed rows kept for retention:

- `outbox_due_idx` orders by (available_at, id), the claim's whole ORDER BY: the claim
  reads its batch off the index and stops, instead of reading every due row sharing an
  available_at and sorting them by id (a claim's cost grew with the backlog);
- autovacuum on the outbox by a fixed number of dead rows, not by 20 % of the table:
  each message leaves dead index entries on the unprocessed-rows indexes, which every
  claim walks over until VACUUM removes them. With 5 M processed rows kept the default
  waited for 1 M dead rows, so claims slowed down round after round while a small table
  was vacuumed every few thousand. PostgreSQL only (reloptions); nothing on SQLite.

The index is rebuilt in place: the build reads the table once (the index itself holds
only unprocessed rows) and blocks outbox writes meanwhile.
"""
from django.db import migrations, models

TABLE = "recovery_outboxmessage"
AUTOVACUUM = "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000"


def autovacuum_by_dead_rows(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} SET ({AUTOVACUUM})")


def autovacuum_default(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} RESET "
                              "(autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)")


class Migration(migrations.Migration):

    dependencies = [
        ('recovery', '0010_outbox_rerun'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='outboxmessage',
            name='outbox_due_idx',
        ),
        migrations.AddIndex(
            model_name='outboxmessage',
            index=models.Index(condition=models.Q(('processed_at__isnull', True)), fields=['available_at', 'id'], name='outbox_due_idx'),
        ),
        migrations.RunPython(autovacuum_by_dead_rows, autovacuum_default),
    ]
