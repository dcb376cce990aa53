"""The held-events queue's partial index: the dashboard's held count read an
index of the held events only, not every event (a parallel sequential scan at 1 M).

In production: AddIndexConcurrently with `atomic = False` (payments 0012 says why).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0001_provider_events'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='providerevent',
            index=models.Index(condition=models.Q(('result', 'held')), fields=['received_at'], name='providerevent_held_idx'),
        ),
    ]
