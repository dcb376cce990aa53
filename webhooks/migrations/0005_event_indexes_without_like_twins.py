"""The events table's indexes without their LIKE twins, plus the waiting-events index.

`unique=True` / `db_index=True` on a CharField builds, on PostgreSQL, a second
`varchar_pattern_ops` index for prefix searches; nothing searches these ids by prefix, and
every ingested event wrote four such twins. The unique constraint and the plain indexes are
created before the old ones are dropped, so the dedupe of redeliveries never lapses.
The waiting index (pending, held, quarantined by time) keeps /metrics and retention counts
to the waiting rows. In production on a large table: the indexes with
AddIndexConcurrently (atomic = False), as payments 0012 says.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0004_event_held_idx'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='providerevent',
            constraint=models.UniqueConstraint(fields=('event_id',), name='providerevent_event_id_uniq'),
        ),
        migrations.AddIndex(
            model_name='providerevent',
            index=models.Index(fields=['object_id'], name='providerevent_object_idx'),
        ),
        migrations.AddIndex(
            model_name='providerevent',
            index=models.Index(fields=['operation_id'], name='providerevent_operation_idx'),
        ),
        migrations.AddIndex(
            model_name='providerevent',
            index=models.Index(fields=['purchase_id'], name='providerevent_purchase_idx'),
        ),
        migrations.AddIndex(
            model_name='providerevent',
            index=models.Index(condition=models.Q(('result__in', ['pending', 'held', 'quarantined'])), fields=['result', 'received_at'], name='providerevent_waiting_idx'),
        ),
        migrations.AlterField(
            model_name='providerevent',
            name='event_id',
            field=models.CharField(max_length=100),
        ),
        migrations.AlterField(
            model_name='providerevent',
            name='object_id',
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.AlterField(
            model_name='providerevent',
            name='operation_id',
            field=models.CharField(blank=True, max_length=40),
        ),
        migrations.AlterField(
            model_name='providerevent',
            name='purchase_id',
            field=models.CharField(blank=True, max_length=40),
        ),
    ]
