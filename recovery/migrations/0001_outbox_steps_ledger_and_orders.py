"""The outbox, fulfilment steps, ledger, orders, settlement and halts. Squashed from
0001_initial … 0006_acp_order_event, which it replaces (a database migrated with those skips
it). The step-run index the console's compensation queue reads is a model index (0007)."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    replaces = [('recovery', '0001_initial'), ('recovery', '0002_ledger_accounts_decision_once'), ('recovery', '0003_bench_indexes'), ('recovery', '0004_bench_steprun_attention_idx'), ('recovery', '0005_i20_dispute_ledger'), ('recovery', '0005_i15a_order_cancelled'), ('recovery', '0006_acp_order_event')]

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='EmailMessage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(max_length=40)),
                ('kind', models.CharField(max_length=32)),
                ('to', models.EmailField(max_length=254)),
                ('subject', models.CharField(max_length=200)),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('purchase_id', 'kind'), name='email_once')],
            },
        ),
        migrations.CreateModel(
            name='InventoryCommit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(max_length=40)),
                ('sku', models.CharField(max_length=64)),
                ('quantity', models.IntegerField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('purchase_id', 'sku'), name='inventory_once')],
            },
        ),
        migrations.CreateModel(
            name='SettlementDiscrepancy',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('provider_reference', models.CharField(max_length=100)),
                ('kind', models.CharField(max_length=40)),
                ('provider_amount', models.BigIntegerField(null=True)),
                ('ledger_amount', models.BigIntegerField(null=True)),
                ('currency', models.CharField(blank=True, max_length=3)),
                ('detail', models.TextField(blank=True)),
                ('resolved_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'constraints': [models.UniqueConstraint(condition=models.Q(('resolved_at__isnull', True)), fields=('provider_reference', 'kind'), name='discrepancy_open_once')],
            },
        ),
        migrations.CreateModel(
            name='StepRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(db_index=True, max_length=40)),
                ('step', models.CharField(choices=[('order', 'Order'), ('inventory', 'Inventory'), ('ledger', 'Ledger'), ('confirmation', 'Confirmation'), ('crm', 'Crm'), ('deliverable', 'Deliverable')], max_length=16)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('running', 'Running'), ('done', 'Done'), ('failed', 'Failed'), ('unknown', 'Unknown'), ('compensated', 'Compensated'), ('manual', 'Manual')], default='pending', max_length=16)),
                ('key', models.CharField(max_length=100)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('external_reference', models.CharField(blank=True, max_length=100)),
                ('result', models.JSONField(blank=True, default=dict)),
                ('last_error', models.TextField(blank=True)),
                ('result_expires_at', models.DateTimeField(blank=True, null=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('completed_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('compensation_operation_id', models.CharField(blank=True, db_index=True, max_length=40)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('purchase_id', 'step'), name='steprun_once'), models.UniqueConstraint(fields=('key',), name='steprun_key_unique')],
            },
        ),
        migrations.CreateModel(
            name='RecoveryDecision',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(db_index=True, max_length=40)),
                ('decision', models.CharField(choices=[('completed_forward', 'Completed Forward'), ('compensated', 'Compensated'), ('manual', 'Manual')], max_length=24)),
                ('detail', models.TextField(blank=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('purchase_id', 'decision'), name='decision_once')],
            },
        ),
        migrations.CreateModel(
            name='CrmUpdate',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(max_length=40, unique=True)),
                ('customer_reference', models.CharField(max_length=200)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.CreateModel(
            name='WorkflowHalt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=40, unique=True)),
                ('reason', models.TextField()),
                ('halted_by', models.CharField(max_length=150)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.CreateModel(
            name='LedgerEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(db_index=True, max_length=40)),
                ('operation_id', models.CharField(max_length=40)),
                ('provider_reference', models.CharField(blank=True, db_index=True, max_length=100)),
                ('entry_type', models.CharField(max_length=24)),
                ('amount', models.BigIntegerField(help_text='signed minor units')),
                ('currency', models.CharField(max_length=3)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('account', models.CharField(choices=[('provider_balance', 'Provider Balance'), ('authorized', 'Authorized'), ('revenue', 'Revenue'), ('disputed', 'Disputed'), ('fees', 'Fees')], default='provider_balance', max_length=24)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('operation_id', 'entry_type', 'account'), name='ledger_once_per_operation_account')],
            },
        ),
        migrations.CreateModel(
            name='Order',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purchase_id', models.CharField(max_length=40, unique=True)),
                ('reference', models.CharField(max_length=40, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('cancelled_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='OutboxMessage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('category', models.PositiveSmallIntegerField(choices=[(1, 'Process Event'), (2, 'Operation Settled'), (3, 'Reconcile'), (4, 'Dispatch'), (5, 'Run Steps'), (20, 'Dispute Changed'), (21, 'Provider Refunds Read'), (30, 'Acp Order Event'), (99, 'Noop')])),
                ('payload', models.JSONField(help_text='ids only')),
                ('dedupe_key', models.CharField(max_length=200)),
                ('available_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('claimed_until', models.DateTimeField(blank=True, null=True)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_error', models.TextField(blank=True)),
                ('processed_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('processed_at__isnull', True)), fields=['available_at'], name='outbox_due_idx')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('processed_at__isnull', True)), fields=('dedupe_key',), name='outbox_dedupe_unprocessed')],
            },
        ),
    ]
