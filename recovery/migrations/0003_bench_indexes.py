"""Performance index found by bench/scale.py (docs/performance.md): the compensation queue
and its dashboard count scanned every StepRun (five per purchase) for the few in trouble.

Pure performance: RunSQL with CREATE INDEX IF NOT EXISTS, so the models' state is
unchanged (makemigrations does not know this partial index, on purpose). On a large live
table, create it CONCURRENTLY by hand first (IF NOT EXISTS then makes this a no-op).
"""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("recovery", "0002_ledger_accounts_decision_once")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS bench_steprun_trouble_idx ON recovery_steprun "
            "(created_at) WHERE state IN ('failed', 'unknown', 'manual')",
            "DROP INDEX IF EXISTS bench_steprun_trouble_idx",
            elidable=True,
        ),
    ]
