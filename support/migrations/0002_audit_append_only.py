"""Audit, resolution and note rows are append-only: enforced in the database itself.

TRUNCATE is left to the owner role (test flushes use it); the application role never
issues it.
"""
from django.db import migrations

TABLES = ["support_auditentry", "support_resolution", "support_note"]

PG_FUNC = """
CREATE OR REPLACE FUNCTION verity_refuse_change() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'append-only table %: % refused', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END; $$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor):
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
    dependencies = [("support", "0001_initial")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
