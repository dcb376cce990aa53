"""Replace bench_steprun_trouble_idx with an index the current compensation queue can use.

recovery.selectors._compensation_needed_qs now selects `state IN ('manual', 'unknown') OR
(state = 'compensated' AND NOT EXISTS (…succeeded compensation…))`; the support fallback
selects `state IN ('failed', 'unknown', 'manual')`. Both imply the predicate below, so
PostgreSQL can use this partial index for either (bench/scale.py measured the queue at
2.0 s p50 at 1 M purchases with a sequential scan of 4 M step runs).

Pure performance, RunSQL only: model state unchanged. On a large live table create it
CONCURRENTLY by hand first (IF NOT EXISTS then makes this a no-op).
"""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("recovery", "0003_bench_indexes")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS bench_steprun_attention_idx ON recovery_steprun "
            "(created_at) WHERE state IN ('failed', 'unknown', 'manual', 'compensated')",
            "DROP INDEX IF EXISTS bench_steprun_attention_idx",
            elidable=True,
        ),
        migrations.RunSQL(
            "DROP INDEX IF EXISTS bench_steprun_trouble_idx",
            "CREATE INDEX IF NOT EXISTS bench_steprun_trouble_idx ON recovery_steprun "
            "(created_at) WHERE state IN ('failed', 'unknown', 'manual')",
            elidable=True,
        ),
    ]
