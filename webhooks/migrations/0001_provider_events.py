"""Provider events: stored once by id, with their processing state, quarantine and
rejection. Squashed from 0001_initial … 0003_i15b_event_rejected, which it replaces (a
database migrated with those skips it)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    replaces = [('webhooks', '0001_initial'), ('webhooks', '0002_event_purchase_quarantine_idx'), ('webhooks', '0003_i15b_event_rejected')]

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='ProviderEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=100, unique=True)),
                ('type', models.CharField(max_length=100)),
                ('account', models.CharField(blank=True, max_length=100)),
                ('object_id', models.CharField(blank=True, db_index=True, max_length=100)),
                ('created', models.DateTimeField(null=True)),
                ('received_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('payload', models.JSONField(help_text='safe fields only')),
                ('result', models.CharField(choices=[('pending', 'Pending'), ('applied', 'Applied'), ('held', 'Held'), ('ignored', 'Ignored'), ('quarantined', 'Quarantined'), ('rejected', 'Rejected')], default='pending', max_length=16)),
                ('result_reason', models.CharField(blank=True, max_length=200)),
                ('operation_id', models.CharField(blank=True, db_index=True, max_length=40)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('processed_at', models.DateTimeField(blank=True, null=True)),
                ('purchase_id', models.CharField(blank=True, db_index=True, max_length=40)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('result', 'quarantined')), fields=['received_at'], name='providerevent_quarantine_idx')],
            },
        ),
    ]
