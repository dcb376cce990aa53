"""The console's query indexes become model indexes (Meta.indexes: partial and expression
indexes), under descriptive names.

They were raw SQL (bench_*, in 0002_bench_indexes, 0003_bench_settled_at_idx and
0006_i18_duplicate_queue_idx, which the squash replaces and does not carry), so a
database migrated with the old chain still has them: they are dropped first (IF EXISTS: a
fresh database never had them), then created from the models, so both end in one schema.
On a large live table, create the new indexes CONCURRENTLY by hand before deploying.

The prefix-search indexes (PostgreSQL pattern-ops classes, which a model index cannot
declare in a way SQLite accepts) are created here too, IF NOT EXISTS: an old-chain database
has them from 0004_i19_purchase_prefix_search_idx. Here, not in the squash, so that they
come after the squash's own indexes, as they did in the old chain (the planner breaks a
cost tie between two equivalent indexes by their order).
"""

import django.db.models.functions.text
from django.conf import settings
from django.db import migrations, models

# Console prefix search (support.selectors.search): `customer_reference LIKE 'q%'` and
# Django's `istartswith` on the e-mail. A plain btree serves LIKE prefixes only under the C
# collation; the pattern-ops classes make it work under any collation. PostgreSQL only.
PREFIX_INDEXES = [
    ("purchase_ref_prefix_idx",
     "payments_purchase (customer_reference varchar_pattern_ops)"),
    ("purchase_email_prefix_idx",
     "payments_purchase ((UPPER(customer_email::text)) text_pattern_ops)"),
]


def prefix_indexes_create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, target in PREFIX_INDEXES:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {target}")


# The raw-SQL names of the same indexes (created by the replaced migrations).
LEGACY_INDEXES = ["bench_op_open_outcome_idx", "bench_op_compensation_idx",
                  "bench_hold_reserved_idx", "bench_purchase_paid_idx",
                  "bench_purchase_email_upper_idx", "bench_op_settled_at_idx",
                  "bench_op_duplicate_idx"]


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0001_purchases_operations_and_rails'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(prefix_indexes_create, migrations.RunPython.noop),
        migrations.RunSQL(
            [f"DROP INDEX IF EXISTS {name}" for name in LEGACY_INDEXES],
            migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name='hold',
            index=models.Index(condition=models.Q(('state', 'reserved')), fields=['operation'], name='hold_reserved_idx'),
        ),
        migrations.AddIndex(
            model_name='paymentoperation',
            index=models.Index(condition=models.Q(('outcome__in', ['succeeded', 'failed']), _negated=True), fields=['outcome', 'created_at'], name='op_open_by_outcome_idx'),
        ),
        migrations.AddIndex(
            model_name='paymentoperation',
            index=models.Index(condition=models.Q(('is_compensation', True)), fields=['created_at'], name='op_compensation_idx'),
        ),
        migrations.AddIndex(
            model_name='paymentoperation',
            index=models.Index(condition=models.Q(('outcome', 'succeeded')), fields=['settled_at'], name='op_succeeded_settled_idx'),
        ),
        migrations.AddIndex(
            model_name='paymentoperation',
            index=models.Index(condition=models.Q(('is_duplicate', True)), fields=['settled_at'], name='op_duplicate_settled_idx'),
        ),
        migrations.AddIndex(
            model_name='purchase',
            index=models.Index(condition=models.Q(('status__in', ['paid', 'fulfilling'])), fields=['updated_at'], name='purchase_awaiting_order_idx'),
        ),
        migrations.AddIndex(
            model_name='purchase',
            index=models.Index(django.db.models.functions.text.Upper('customer_email'), name='purchase_email_upper_idx'),
        ),
    ]
