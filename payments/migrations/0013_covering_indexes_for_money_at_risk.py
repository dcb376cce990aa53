"""Covering indexes for the dashboard's money at risk: the unknown operations' ids and
the reserved holds' amounts are read from the indexes alone (index-only scans), not from a
heap page per row. In production on large tables: AddIndexConcurrently (atomic = False).
"""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0012_dashboard_count_indexes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='hold',
            name='hold_reserved_idx',
        ),
        migrations.RemoveIndex(
            model_name='paymentoperation',
            name='op_open_by_outcome_idx',
        ),
        migrations.AddIndex(
            model_name='hold',
            index=models.Index(condition=models.Q(('state', 'reserved')), fields=['operation'], include=('currency', 'amount', 'api_client'), name='hold_reserved_idx'),
        ),
        migrations.AddIndex(
            model_name='paymentoperation',
            index=models.Index(condition=models.Q(('outcome__in', ['succeeded', 'failed']), _negated=True), fields=['outcome', 'created_at'], include=('id',), name='op_open_by_outcome_idx'),
        ),
    ]
