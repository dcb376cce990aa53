"""ACP checkout sessions and agent platforms. Squashed from 0001_initial and
0002_agent_platform, which it replaces (a database migrated with those skips it)."""

import acp.models
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    replaces = [('acp', '0001_initial'), ('acp', '0002_agent_platform')]

    dependencies = [
        ('payments', '0001_purchases_operations_and_rails'),
    ]

    operations = [
        migrations.CreateModel(
            name='CheckoutSession',
            fields=[
                ('id', models.CharField(default=acp.models.new_session_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('currency', models.CharField(max_length=3)),
                ('items', models.JSONField(default=list)),
                ('buyer', models.JSONField(blank=True, null=True)),
                ('fulfillment_details', models.JSONField(blank=True, null=True)),
                ('selected_fulfillment_options', models.JSONField(blank=True, default=list)),
                ('canceled_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('api_client', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='acp_sessions', to='payments.apiclient')),
                ('purchase', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='acp_session', to='payments.purchase')),
                ('quote', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='payments.quote')),
            ],
            options={
                'indexes': [models.Index(fields=['api_client', 'created_at'], name='acp_session_client_idx')],
            },
        ),
        migrations.CreateModel(
            name='AgentPlatform',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('webhook_url', models.URLField(blank=True, max_length=500)),
                ('webhook_secret', models.CharField(blank=True, max_length=200)),
                ('signing_secret', models.CharField(blank=True, max_length=200)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('api_client', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='acp_platform', to='payments.apiclient')),
            ],
        ),
    ]
