"""The compensation queue's partial index becomes a model index (Meta.indexes).

It was raw SQL (bench_steprun_attention_idx, in 0004_bench_steprun_attention_idx, which the
squash replaces and does not carry): a database migrated with the old chain drops it here
(IF EXISTS: a fresh one never had it) and both get the model's. On a large live table,
create it CONCURRENTLY by hand before deploying.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('recovery', '0001_outbox_steps_ledger_and_orders'),
    ]

    operations = [
        migrations.RunSQL("DROP INDEX IF EXISTS bench_steprun_attention_idx",
                          migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name='steprun',
            index=models.Index(condition=models.Q(('state__in', ['failed', 'unknown', 'manual', 'compensated'])), fields=['created_at'], name='steprun_attention_idx'),
        ),
    ]
