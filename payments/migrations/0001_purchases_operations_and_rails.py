"""Purchases, quotes, operations, provider calls, holds, disputes, x402 transfers and ACP
channels: the payments app's schema in one migration (squashed from 0001_initial …
0009_external_operation_reviewed_at_by, which it replaces; a database migrated with those
skips it). The console's query indexes, and its prefix-search indexes, are created by
0010_console_query_indexes_in_models.
"""
import django.db.models.deletion
import django_fsm
from django.conf import settings
from django.db import migrations, models

import payments.models

class Migration(migrations.Migration):

    replaces = [('payments', '0001_initial'), ('payments', '0002_bench_indexes'), ('payments', '0003_bench_settled_at_idx'), ('payments', '0004_i24_one_buyer_one_charge'), ('payments', '0005_i20_disputes'), ('payments', '0004_i15a_duplicate_and_overturn'), ('payments', '0004_i19_purchase_prefix_search_idx'), ('payments', '0006_i21_x402_rail'), ('payments', '0006_i18_duplicate_queue_idx'), ('payments', '0007_r2a_x402_refund'), ('payments', '0007_r2b_purchase_paid_at'), ('payments', '0008_acp_channel'), ('payments', '0009_external_operation_reviewed_at_by')]

    dependencies = [
        ('auth', '__first__'),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiClient',
            fields=[
                ('id', models.CharField(editable=False, max_length=150, primary_key=True, serialize=False, unique=True)),
                ('prefix', models.CharField(editable=False, max_length=8, unique=True)),
                ('hashed_key', models.CharField(editable=False, max_length=150)),
                ('created', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('name', models.CharField(default=None, help_text='A free-form name for the API key. Need not be unique. 50 characters max.', max_length=50)),
                ('revoked', models.BooleanField(blank=True, default=False, help_text='If the API key is revoked, clients cannot use it anymore. (This cannot be undone.)')),
                ('expiry_date', models.DateTimeField(blank=True, help_text='Once API key expires, clients cannot use it anymore.', null=True, verbose_name='Expires')),
                ('scopes', models.JSONField(default=list)),
                ('spending_limit', models.BigIntegerField(default=0, help_text='minor units; 0 = no limit')),
                ('currency', models.CharField(default='usd', max_length=3)),
                ('limit_period', models.CharField(choices=[('none', 'None'), ('day', 'Day'), ('month', 'Month')], default='none', max_length=8)),
                ('auto_refund_limit', models.BigIntegerField(default=0, help_text='API refunds up to this amount skip approval; 0 = always approve')),
            ],
            options={
                'verbose_name': 'API client',
                'verbose_name_plural': 'API keys',
                'ordering': ('-created',),
                'abstract': False,
            },
        ),
        migrations.CreateModel(
            name='PaymentOperation',
            fields=[
                ('id', models.CharField(default=payments.models.new_operation_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('charge', 'Charge'), ('authorize', 'Authorize'), ('capture', 'Capture'), ('void', 'Void'), ('refund', 'Refund')], max_length=16)),
                ('amount', models.BigIntegerField()),
                ('currency', models.CharField(max_length=3)),
                ('idempotency_key', models.CharField(default=payments.models.new_provider_key, max_length=64, unique=True)),
                ('request_fingerprint', models.CharField(blank=True, max_length=64)),
                ('provider_reference', models.CharField(blank=True, db_index=True, max_length=100)),
                ('provider_charge', models.CharField(blank=True, db_index=True, max_length=100)),
                ('provider_account', models.CharField(blank=True, max_length=100)),
                ('payment_method', models.CharField(blank=True, help_text='a provider token', max_length=100)),
                ('capture_method', models.CharField(default='automatic', max_length=16)),
                ('outcome', django_fsm.FSMField(choices=[('pending', 'Pending'), ('dispatching', 'Dispatching'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('unknown', 'Unknown'), ('awaiting_provider', 'Awaiting Provider'), ('awaiting_buyer', 'Awaiting Buyer'), ('awaiting_approval', 'Awaiting Approval')], default='pending', max_length=24, protected=True)),
                ('stage', models.CharField(choices=[('queued', 'Queued'), ('dispatching', 'Dispatching'), ('reconciling', 'Reconciling'), ('settled', 'Settled'), ('escalated', 'Escalated')], default='queued', max_length=16)),
                ('grade', models.CharField(blank=True, choices=[('', 'None'), ('confirmed', 'Confirmed'), ('acknowledged', 'Acknowledged')], default='', max_length=16)),
                ('verification', models.CharField(choices=[('unverified', 'Unverified'), ('provider', 'Provider'), ('webhook', 'Webhook'), ('manual', 'Manual')], default='unverified', max_length=16)),
                ('reason', models.CharField(blank=True, max_length=40)),
                ('next_action_owner', models.CharField(choices=[('buyer', 'Buyer'), ('reconciliation', 'Reconciliation'), ('support', 'Support'), ('none', 'None')], default='none', max_length=16)),
                ('provider_status', models.CharField(blank=True, max_length=40)),
                ('confirm_claimed_at', models.DateTimeField(blank=True, null=True)),
                ('dispatch_deadline', models.DateTimeField(blank=True, db_index=True, null=True)),
                ('reconcile_attempts', models.PositiveIntegerField(default=0)),
                ('next_reconcile_at', models.DateTimeField(blank=True, db_index=True, null=True)),
                ('reconcile_deadline', models.DateTimeField(blank=True, null=True)),
                ('escalated_at', models.DateTimeField(blank=True, null=True)),
                ('is_compensation', models.BooleanField(default=False)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('settled_at', models.DateTimeField(blank=True, null=True)),
                ('approved_by_user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('parent', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='children', to='payments.paymentoperation')),
                ('requested_by_client', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, to='payments.apiclient')),
                ('requested_by_user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('retry_of', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='retried_by', to='payments.paymentoperation')),
            ],
            bases=(django_fsm.ConcurrentTransitionMixin, models.Model),
        ),
        migrations.CreateModel(
            name='Hold',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('amount', models.BigIntegerField()),
                ('currency', models.CharField(max_length=3)),
                ('state', models.CharField(choices=[('reserved', 'Reserved'), ('consumed', 'Consumed'), ('released', 'Released')], default='reserved', max_length=16)),
                ('period_start', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('api_client', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='holds', to='payments.apiclient')),
                ('operation', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='hold', to='payments.paymentoperation')),
            ],
        ),
        migrations.CreateModel(
            name='Product',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('sku', models.CharField(max_length=64, unique=True)),
                ('name', models.CharField(max_length=200)),
                ('price', models.BigIntegerField(help_text='minor units')),
                ('currency', models.CharField(default='usd', max_length=3)),
                ('stock', models.IntegerField(default=0)),
                ('kind', models.CharField(choices=[('physical', 'Physical'), ('digital', 'Digital')], default='physical', max_length=16)),
                ('step_policy', models.JSONField(blank=True, default=dict)),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('price__gte', 0)), name='product_price_nonneg')],
            },
        ),
        migrations.CreateModel(
            name='Purchase',
            fields=[
                ('id', models.CharField(default=payments.models.new_purchase_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('amount', models.BigIntegerField()),
                ('currency', models.CharField(max_length=3)),
                ('customer_reference', models.CharField(db_index=True, max_length=200)),
                ('customer_email', models.EmailField(blank=True, db_index=True, max_length=254)),
                ('status', django_fsm.FSMField(choices=[('awaiting_payment', 'Awaiting Payment'), ('payment_pending', 'Payment Pending'), ('payment_unknown', 'Payment Unknown'), ('payment_failed', 'Payment Failed'), ('action_required', 'Action Required'), ('paid', 'Paid'), ('fulfilling', 'Fulfilling'), ('completed', 'Completed'), ('manual_review', 'Manual Review'), ('refund_pending', 'Refund Pending'), ('refunded', 'Refunded'), ('voided', 'Voided'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], default='awaiting_payment', max_length=32, protected=True)),
                ('status_token', models.CharField(default=payments.models.new_status_token, max_length=64, unique=True)),
                ('recovery_owner', models.CharField(blank=True, max_length=100)),
                ('acknowledged_unresolved', models.JSONField(blank=True, default=list)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('api_client', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, to='payments.apiclient')),
            ],
            bases=(django_fsm.ConcurrentTransitionMixin, models.Model),
        ),
        migrations.AddField(
            model_name='paymentoperation',
            name='purchase',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='operations', to='payments.purchase'),
        ),
        migrations.CreateModel(
            name='OperationTransition',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('field', models.CharField(max_length=16)),
                ('source', models.CharField(max_length=32)),
                ('target', models.CharField(max_length=32)),
                ('cause', models.CharField(max_length=64)),
                ('evidence', models.JSONField(blank=True, default=dict)),
                ('actor', models.CharField(blank=True, max_length=150)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('operation', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='transitions', to='payments.paymentoperation')),
                ('purchase', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='transitions', to='payments.purchase')),
            ],
            options={
                'ordering': ['created_at', 'id'],
            },
        ),
        migrations.CreateModel(
            name='Quote',
            fields=[
                ('id', models.CharField(default=payments.models.new_quote_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('items', models.JSONField(help_text='[{sku, name, quantity, unit_price}]')),
                ('amount', models.BigIntegerField()),
                ('currency', models.CharField(max_length=3)),
                ('version', models.PositiveIntegerField(default=1)),
                ('expires_at', models.DateTimeField()),
                ('superseded_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('api_client', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, to='payments.apiclient')),
            ],
        ),
        migrations.AddField(
            model_name='purchase',
            name='quote',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='purchases', to='payments.quote'),
        ),
        migrations.CreateModel(
            name='IdempotencyRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('route', models.CharField(max_length=120)),
                ('key', models.CharField(max_length=255)),
                ('fingerprint', models.CharField(max_length=64)),
                ('state', models.CharField(choices=[('in_flight', 'In Flight'), ('done', 'Done')], default='in_flight', max_length=16)),
                ('lease_until', models.DateTimeField()),
                ('resource_type', models.CharField(blank=True, max_length=32)),
                ('resource_id', models.CharField(blank=True, max_length=64)),
                ('response_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('api_client', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to='payments.apiclient')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('api_client', 'route', 'key'), name='idem_scope_unique')],
            },
        ),
        migrations.CreateModel(
            name='ProviderCall',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purpose', models.CharField(choices=[('dispatch', 'Dispatch'), ('reconcile', 'Reconcile'), ('replay', 'Replay')], max_length=16)),
                ('step', models.CharField(choices=[('create', 'Create'), ('confirm', 'Confirm'), ('capture', 'Capture'), ('cancel', 'Cancel'), ('refund', 'Refund'), ('retrieve', 'Retrieve'), ('list', 'List')], max_length=16)),
                ('attempt', models.PositiveSmallIntegerField(default=1)),
                ('key', models.CharField(blank=True, max_length=100)),
                ('request_id', models.CharField(blank=True, max_length=100)),
                ('http_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('classification', models.CharField(blank=True, choices=[('ok', 'Ok'), ('declined', 'Declined'), ('rejected', 'Rejected'), ('not_sent', 'Not Sent'), ('unknown', 'Unknown'), ('retryable', 'Retryable'), ('not_found', 'Not Found'), ('in_flight', 'In Flight')], max_length=16)),
                ('safe_fields', models.JSONField(blank=True, default=dict)),
                ('error_code', models.CharField(blank=True, max_length=64)),
                ('fault_drill', models.CharField(blank=True, max_length=40)),
                ('started_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('operation', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='provider_calls', to='payments.paymentoperation')),
            ],
            options={
                'ordering': ['started_at', 'id'],
                'constraints': [models.UniqueConstraint(condition=models.Q(('purpose', 'dispatch')), fields=('operation', 'step', 'attempt'), name='providercall_one_dispatch_per_step_attempt')],
            },
        ),
        migrations.AddConstraint(
            model_name='paymentoperation',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='op_amount_pos'),
        ),
        migrations.AddConstraint(
            model_name='paymentoperation',
            constraint=models.UniqueConstraint(condition=models.Q(('outcome__in', ['pending', 'dispatching', 'unknown', 'awaiting_provider', 'awaiting_buyer'])), fields=('purchase',), name='op_one_active_per_purchase'),
        ),
        migrations.AddConstraint(
            model_name='paymentoperation',
            constraint=models.UniqueConstraint(condition=models.Q(('kind__in', ['charge', 'authorize']), ('outcome', 'succeeded')), fields=('purchase',), name='op_one_success_payment_per_purchase'),
        ),
        migrations.AddConstraint(
            model_name='quote',
            constraint=models.CheckConstraint(condition=models.Q(('amount__gt', 0)), name='quote_amount_pos'),
        ),
        migrations.AddField(
            model_name='apiclient',
            name='storefront_confirmation',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='product',
            name='duplicate_window_seconds',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='product',
            name='never_twice',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='purchase',
            name='basket_fingerprint',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='purchase',
            name='customer_key',
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.CreateModel(
            name='BuyerConfirmation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('code_hash', models.CharField(max_length=64, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('expires_at', models.DateTimeField()),
                ('used_at', models.DateTimeField(blank=True, null=True)),
                ('used_for', models.CharField(blank=True, help_text="the new purchase's id", max_length=40)),
            ],
        ),
        migrations.AddIndex(
            model_name='purchase',
            index=models.Index(fields=['api_client', 'customer_key', 'created_at'], name='purchase_client_customer_idx'),
        ),
        migrations.AddConstraint(
            model_name='purchase',
            constraint=models.UniqueConstraint(fields=('quote',), name='purchase_one_per_quote'),
        ),
        migrations.AddField(
            model_name='buyerconfirmation',
            name='purchase',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='buyer_confirmations', to='payments.purchase'),
        ),
        migrations.CreateModel(
            name='Dispute',
            fields=[
                ('id', models.CharField(help_text="the provider's id", max_length=100, primary_key=True, serialize=False)),
                ('charge', models.CharField(blank=True, max_length=100)),
                ('payment_intent', models.CharField(blank=True, max_length=100)),
                ('amount', models.BigIntegerField()),
                ('currency', models.CharField(max_length=3)),
                ('reason', models.CharField(blank=True, max_length=40)),
                ('status', models.CharField(choices=[('warning_needs_response', 'Warning Needs Response'), ('warning_under_review', 'Warning Under Review'), ('warning_closed', 'Warning Closed'), ('needs_response', 'Needs Response'), ('under_review', 'Under Review'), ('won', 'Won'), ('lost', 'Lost'), ('charge_refunded', 'Charge Refunded')], max_length=32)),
                ('evidence_due_by', models.DateTimeField(blank=True, db_index=True, null=True)),
                ('funds_withdrawn', models.BigIntegerField(default=0, help_text='minor units, positive')),
                ('funds_reinstated', models.BigIntegerField(default=0, help_text='minor units, positive')),
                ('fees', models.BigIntegerField(default=0, help_text='dispute fees net, minor units')),
                ('balance_transactions', models.JSONField(blank=True, default=list)),
                ('verification', models.CharField(default='webhook', max_length=16)),
                ('purchase_status_before', models.CharField(blank=True, max_length=32)),
                ('opened_at', models.DateTimeField(auto_now_add=True)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ['opened_at', 'id'],
            },
        ),
        migrations.AddField(
            model_name='paymentoperation',
            name='reviewed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='paymentoperation',
            name='reviewed_by',
            field=models.CharField(blank=True, max_length=150),
        ),
        migrations.AddField(
            model_name='paymentoperation',
            name='origin',
            field=models.CharField(choices=[('verity', 'Verity'), ('provider', 'Provider')], default='verity', max_length=16),
        ),
        migrations.AlterField(
            model_name='purchase',
            name='status',
            field=django_fsm.FSMField(choices=[('awaiting_payment', 'Awaiting Payment'), ('payment_pending', 'Payment Pending'), ('payment_unknown', 'Payment Unknown'), ('payment_failed', 'Payment Failed'), ('action_required', 'Action Required'), ('paid', 'Paid'), ('fulfilling', 'Fulfilling'), ('completed', 'Completed'), ('manual_review', 'Manual Review'), ('refund_pending', 'Refund Pending'), ('refunded', 'Refunded'), ('voided', 'Voided'), ('cancelled', 'Cancelled'), ('expired', 'Expired'), ('disputed', 'Disputed'), ('dispute_won', 'Dispute Won'), ('dispute_lost', 'Dispute Lost')], default='awaiting_payment', max_length=32, protected=True),
        ),
        migrations.AddConstraint(
            model_name='paymentoperation',
            constraint=models.UniqueConstraint(condition=models.Q(('origin', 'provider')), fields=('kind', 'provider_reference'), name='op_external_once_per_provider_object'),
        ),
        migrations.AddField(
            model_name='dispute',
            name='payment',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='disputes', to='payments.paymentoperation'),
        ),
        migrations.AddField(
            model_name='dispute',
            name='purchase',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='disputes', to='payments.purchase'),
        ),
        migrations.RemoveConstraint(
            model_name='paymentoperation',
            name='op_one_success_payment_per_purchase',
        ),
        migrations.AddField(
            model_name='paymentoperation',
            name='is_duplicate',
            field=models.BooleanField(default=False),
        ),
        migrations.AddConstraint(
            model_name='paymentoperation',
            constraint=models.UniqueConstraint(condition=models.Q(('is_duplicate', False), ('kind__in', ['charge', 'authorize']), ('outcome', 'succeeded')), fields=('purchase',), name='op_one_success_payment_per_purchase'),
        ),
        migrations.AddField(
            model_name='paymentoperation',
            name='rail',
            field=models.CharField(choices=[('stripe', 'Stripe'), ('x402', 'X402')], default='stripe', max_length=8),
        ),
        migrations.AlterField(
            model_name='providercall',
            name='step',
            field=models.CharField(choices=[('create', 'Create'), ('confirm', 'Confirm'), ('capture', 'Capture'), ('cancel', 'Cancel'), ('refund', 'Refund'), ('retrieve', 'Retrieve'), ('list', 'List'), ('settle', 'Settle')], max_length=16),
        ),
        migrations.CreateModel(
            name='X402RefundTransfer',
            fields=[
                ('operation', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, primary_key=True, related_name='x402_refund', serialize=False, to='payments.paymentoperation')),
                ('network', models.CharField(max_length=40)),
                ('asset', models.CharField(max_length=42)),
                ('from_address', models.CharField(help_text='the refund signer', max_length=42)),
                ('to_address', models.CharField(help_text='the payer of the charge', max_length=42)),
                ('value', models.CharField(help_text='atomic units of the asset', max_length=78)),
                ('chain_nonce', models.BigIntegerField(blank=True, null=True)),
                ('transaction_hash', models.CharField(blank=True, db_index=True, max_length=66)),
                ('block_number', models.BigIntegerField(blank=True, null=True)),
                ('confirmations', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.AddField(
            model_name='purchase',
            name='paid_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='X402Authorization',
            fields=[
                ('operation', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, primary_key=True, related_name='x402', serialize=False, to='payments.paymentoperation')),
                ('network', models.CharField(max_length=40)),
                ('asset', models.CharField(max_length=42)),
                ('pay_to', models.CharField(max_length=42)),
                ('payer', models.CharField(help_text='checksummed `from`', max_length=42)),
                ('nonce', models.CharField(help_text='0x + 32 bytes', max_length=66)),
                ('value', models.CharField(help_text='atomic units of the asset', max_length=78)),
                ('valid_after', models.BigIntegerField()),
                ('valid_before', models.BigIntegerField()),
                ('signature_hash', models.CharField(max_length=64)),
                ('payload_hash', models.CharField(max_length=64)),
                ('payment_identifier', models.CharField(blank=True, max_length=128)),
                ('transaction_hash', models.CharField(blank=True, db_index=True, max_length=66)),
                ('block_number', models.BigIntegerField(blank=True, null=True)),
                ('confirmations', models.PositiveIntegerField(default=0)),
                ('settle_answer', models.JSONField(blank=True, default=dict, help_text="the facilitator's SettleResponse, safe fields")),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('payer', 'nonce'), name='x402_one_op_per_authorization'), models.UniqueConstraint(condition=models.Q(('payment_identifier', ''), _negated=True), fields=('payment_identifier',), name='x402_one_op_per_payment_identifier')],
            },
        ),
        migrations.AddField(
            model_name='purchase',
            name='channel',
            field=models.CharField(choices=[('api', 'Api'), ('acp', 'Acp')], default='api', max_length=16),
        ),
    ]
