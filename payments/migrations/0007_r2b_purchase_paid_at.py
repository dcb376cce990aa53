"""The time a purchase last entered `paid`, stored on the purchase
(the console computed it with a correlated subquery over the history per row). Backfilled
from the history: the latest status transition to `paid` of each purchase."""
from django.db import migrations, models

BACKFILL = """
UPDATE payments_purchase SET paid_at = (
    SELECT max(t.created_at) FROM payments_operationtransition t
    WHERE t.purchase_id = payments_purchase.id AND t.field = 'status' AND t.target = 'paid')
WHERE EXISTS (
    SELECT 1 FROM payments_operationtransition t
    WHERE t.purchase_id = payments_purchase.id AND t.field = 'status' AND t.target = 'paid')
"""


class Migration(migrations.Migration):

    dependencies = [("payments", "0007_r2a_x402_refund")]

    operations = [
        migrations.AddField(
            model_name="purchase",
            name="paid_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop, elidable=True),
    ]
