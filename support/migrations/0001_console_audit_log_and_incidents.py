"""The console's tables and the audit log (audit, resolutions, notes: append-only, enforced
by the database itself), squashed from 0001_initial … 0004_incidents, which it replaces.

0005_i17_audit_moves_to_audit_app stays a migration of its own: it hands the audit models'
state to the audit app, whose 0001_initial depends on this app, and a squash that took it
in would depend on audit in turn (a cycle). TRUNCATE is left to the owner role (test
flushes use it); the application role never issues it.
"""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

TABLES = ["support_auditentry", "support_resolution", "support_note"]

PG_FUNC = """
CREATE OR REPLACE FUNCTION verity_refuse_change() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'append-only table %: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END; $$ LANGUAGE plpgsql;
"""


def append_only_triggers_create(apps, schema_editor):
    # The triggers differ by database (PL/pgSQL on PostgreSQL, RAISE(ABORT) on SQLite):
    # Python picks the SQL, which one RunSQL could not.
    conn = schema_editor.connection
    with conn.cursor() as cur:
        if conn.vendor == "postgresql":
            cur.execute(PG_FUNC)
            for t in TABLES:
                cur.execute(
                    f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
                    f"FOR EACH ROW EXECUTE FUNCTION verity_refuse_change();"
                )
        elif conn.vendor == "sqlite":
            for t in TABLES:
                for op in ("UPDATE", "DELETE"):
                    cur.execute(
                        f"CREATE TRIGGER {t}_no_{op.lower()} BEFORE {op} ON {t} "
                        f"BEGIN SELECT RAISE(ABORT, 'append-only table {t}'); END;"
                    )


class Migration(migrations.Migration):

    replaces = [('support', '0001_initial'), ('support', '0002_audit_append_only'), ('support', '0003_audit_ip_before_after_login_failures'), ('support', '0004_incidents')]

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('actor', models.CharField(max_length=150)),
                ('action', models.CharField(max_length=64)),
                ('target_type', models.CharField(max_length=32)),
                ('target_id', models.CharField(db_index=True, max_length=64)),
                ('purchase_id', models.CharField(blank=True, db_index=True, max_length=40)),
                ('reason', models.TextField()),
                ('detail', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
            ],
            options={
                'ordering': ['created_at', 'id'],
            },
        ),
        migrations.CreateModel(
            name='Resolution',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('operation_id', models.CharField(db_index=True, max_length=40)),
                ('purchase_id', models.CharField(db_index=True, max_length=40)),
                ('outcome', models.CharField(max_length=24)),
                ('reason', models.TextField()),
                ('actor', models.CharField(max_length=150)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.CreateModel(
            name='Note',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(db_index=True, max_length=40)),
                ('body', models.TextField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('author', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, to=settings.AUTH_USER_MODEL)),
            ],
        ),
        migrations.AddField(
            model_name='auditentry',
            name='after',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='auditentry',
            name='before',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='auditentry',
            name='ip',
            field=models.GenericIPAddressField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='LoginFailure',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('ip', models.GenericIPAddressField(blank=True, null=True)),
                ('username', models.CharField(blank=True, max_length=150)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
            ],
            options={
                'indexes': [models.Index(fields=['ip', 'created_at'], name='loginfail_ip_idx'), models.Index(fields=['username', 'created_at'], name='loginfail_user_idx')],
            },
        ),
        migrations.CreateModel(
            name='Incident',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('title', models.CharField(max_length=200)),
                ('summary', models.TextField()),
                ('status', models.CharField(choices=[('open', 'Open'), ('closed', 'Closed')], db_index=True, default='open', max_length=8)),
                ('opened_at', models.DateTimeField(auto_now_add=True)),
                ('halts', models.JSONField(blank=True, default=list)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('review', models.TextField(blank=True)),
                ('closed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('opened_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-opened_at', '-id'],
            },
        ),
        migrations.CreateModel(
            name='IncidentItem',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(db_index=True, max_length=40)),
                ('operation_id', models.CharField(blank=True, max_length=40)),
                ('attached_at', models.DateTimeField(auto_now_add=True)),
                ('final_outcome', models.CharField(blank=True, choices=[('completed_forward', 'Completed Forward'), ('compensated', 'Compensated'), ('manual', 'Manual')], max_length=24)),
                ('attached_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('incident', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='items', to='support.incident')),
            ],
            options={
                'ordering': ['attached_at', 'id'],
                'constraints': [models.UniqueConstraint(fields=('incident', 'purchase_id', 'operation_id'), name='incidentitem_once_per_incident')],
            },
        ),
        migrations.RunPython(append_only_triggers_create, migrations.RunPython.noop),
    ]
