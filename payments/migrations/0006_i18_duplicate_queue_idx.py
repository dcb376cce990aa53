"""Index for the console's duplicate-charges queue and its dashboard count:
`support.selectors._q_duplicates` (is_duplicate, oldest by settled_at) was a sequential
scan of every operation (bench/scale.py --explain: 67 ms, 5 700 pages read at 100 k
purchases, growing with the table).

Pure performance, RunSQL only: model state unchanged. On a large live table create it
CONCURRENTLY by hand first (IF NOT EXISTS then makes this a no-op). SQLite parses the
same partial index.
"""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("payments", "0006_i21_x402_rail")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS bench_op_duplicate_idx ON payments_paymentoperation "
            "(settled_at) WHERE is_duplicate",
            "DROP INDEX IF EXISTS bench_op_duplicate_idx",
            elidable=True,
        ),
    ]
