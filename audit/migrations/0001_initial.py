"""AuditEntry, Resolution and Note move from support to audit. State only: the
tables keep their names (and their append-only triggers); nothing in the database moves."""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("support", "0004_incidents"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="AuditEntry",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("actor", models.CharField(max_length=150)),
                        ("action", models.CharField(max_length=64)),
                        ("target_type", models.CharField(max_length=32)),
                        ("target_id", models.CharField(db_index=True, max_length=64)),
                        ("purchase_id", models.CharField(blank=True, db_index=True, max_length=40)),
                        ("reason", models.TextField()),
                        ("detail", models.JSONField(blank=True, default=dict)),
                        ("ip", models.GenericIPAddressField(blank=True, null=True)),
                        ("before", models.JSONField(blank=True, default=dict)),
                        ("after", models.JSONField(blank=True, default=dict)),
                        ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                    ],
                    options={"db_table": "support_auditentry", "ordering": ["created_at", "id"]},
                ),
                migrations.CreateModel(
                    name="Resolution",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("operation_id", models.CharField(db_index=True, max_length=40)),
                        ("purchase_id", models.CharField(db_index=True, max_length=40)),
                        ("outcome", models.CharField(max_length=24)),
                        ("reason", models.TextField()),
                        ("actor", models.CharField(max_length=150)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={"db_table": "support_resolution"},
                ),
                migrations.CreateModel(
                    name="Note",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("purchase_id", models.CharField(db_index=True, max_length=40)),
                        ("body", models.TextField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("author", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, to=settings.AUTH_USER_MODEL)),
                    ],
                    options={"db_table": "support_note"},
                ),
            ],
        ),
    ]
