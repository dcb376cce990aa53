"""Index for the console dashboard's "recently settled payments" figure
(support.selectors: kind IN (charge, authorize), outcome succeeded, settled_at >= now − 7 d),
which bench/scale.py measured as a sequential scan of every operation (45 ms at 100 k
purchases, growing with the table).

Pure performance, RunSQL only: model state unchanged. On a large live table create it
CONCURRENTLY by hand first (IF NOT EXISTS then makes this a no-op).
"""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("payments", "0002_bench_indexes")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS bench_op_settled_at_idx ON payments_paymentoperation "
            "(settled_at) WHERE outcome = 'succeeded'",
            "DROP INDEX IF EXISTS bench_op_settled_at_idx",
            elidable=True,
        ),
    ]
