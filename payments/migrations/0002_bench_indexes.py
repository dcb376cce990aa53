"""Performance indexes found by bench/scale.py (docs/performance.md): console queues,
dashboard counts and e-mail search did sequential scans that grow with the table.

Pure performance: RunSQL with CREATE INDEX IF NOT EXISTS, so the models' state is
unchanged (makemigrations does not know these indexes, on purpose — they are partial or
expression indexes tuned to the console's exact predicates; see support/selectors.py).
On a large live table, create them CONCURRENTLY by hand before deploying this migration
(IF NOT EXISTS then makes it a no-op).
"""
from django.db import migrations

INDEXES = [
    # Open operations by outcome, oldest first: the unknown / escalated / refund-approval
    # queues and their dashboard counts (settled operations are >95 % of the table).
    ("bench_op_open_outcome_idx",
     "payments_paymentoperation (outcome, created_at) "
     "WHERE outcome NOT IN ('succeeded', 'failed')"),
    # Compensation operations (rare): the compensation queue.
    ("bench_op_compensation_idx",
     "payments_paymentoperation (created_at) WHERE is_compensation"),
    # Reserved holds: the dashboard's money at risk (unknown exposure).
    ("bench_hold_reserved_idx", "payments_hold (operation_id) WHERE state = 'reserved'"),
    # Paid purchases waiting for fulfilment: the paid-without-order queue.
    ("bench_purchase_paid_idx",
     "payments_purchase (updated_at) WHERE status IN ('paid', 'fulfilling')"),
    # Console search by e-mail uses customer_email__iexact, i.e. UPPER(customer_email).
    ("bench_purchase_email_upper_idx", "payments_purchase (UPPER(customer_email))"),
]


class Migration(migrations.Migration):
    dependencies = [("payments", "0001_initial")]

    operations = [
        migrations.RunSQL(f"CREATE INDEX IF NOT EXISTS {name} ON {target}",
                          f"DROP INDEX IF EXISTS {name}", elidable=True)
        for name, target in INDEXES
    ]
