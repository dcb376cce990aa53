"""Partial indexes for the console dashboard's counts: each holds only its queue's
rows, so a count reads the rows it reports, not the table (docs/performance.md).

- purchase_paid_no_order_idx: paid/fulfilling purchases by paid_at, so the
  paid-without-order count walks them oldest first through a nested-loop anti join on
  recovery_order.purchase_id and stops at the cap, instead of hashing every order;
- op_support_owned_settled_idx: operations support owns, for the overturned queue
  (EXISTS on the operation's overturn transition);
- op_escalated_idx: escalated operations, for the escalated queue.

On a large live table these are created CONCURRENTLY, outside a transaction: in production
this migration would be `atomic = False` with
django.contrib.postgres.operations.AddIndexConcurrently in place of AddIndex (a plain
CREATE INDEX locks the table against writes while it builds).
"""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0011_purchase_channel_every_way_in'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name='paymentoperation',
            index=models.Index(condition=models.Q(('stage', 'escalated'), ('escalated_at__isnull', False), _connector='OR'), fields=['created_at'], name='op_escalated_idx'),
        ),
        migrations.AddIndex(
            model_name='paymentoperation',
            index=models.Index(condition=models.Q(('next_action_owner', 'support')), fields=['settled_at'], name='op_support_owned_settled_idx'),
        ),
        migrations.AddIndex(
            model_name='purchase',
            index=models.Index(condition=models.Q(('status__in', ['paid', 'fulfilling'])), fields=['paid_at'], name='purchase_paid_no_order_idx'),
        ),
    ]
