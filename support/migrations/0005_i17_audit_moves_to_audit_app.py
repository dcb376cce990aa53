"""AuditEntry, Resolution and Note now belong to the `audit` app (audit/0001): state only,
the tables and their append-only triggers stay where they are."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("support", "0004_incidents"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.DeleteModel(name="AuditEntry"),
                migrations.DeleteModel(name="Resolution"),
                migrations.DeleteModel(name="Note"),
            ],
        ),
    ]
