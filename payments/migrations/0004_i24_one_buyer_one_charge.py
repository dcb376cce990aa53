"""One buyer, one charge: normalised customer keys scoped per API client, the
basket fingerprint of the duplicate-purchase guard, buyer confirmations, and one purchase
per quote.

Existing purchases get their key and fingerprint computed here. If a quote already backs
several purchases (the defect this closes), the constraint cannot be added: the migration
stops and names them, for support to review first (nothing is deleted automatically).
"""
import django.db.models.deletion
from django.db import migrations, models


def backfill(apps, schema_editor):
    from payments.customers import basket_fingerprint, customer_key

    Purchase = apps.get_model("payments", "Purchase")
    for purchase in Purchase.objects.select_related("quote").iterator(chunk_size=500):
        purchase.customer_key = customer_key(purchase.customer_reference)
        purchase.basket_fingerprint = basket_fingerprint(
            items=purchase.quote.items, amount=purchase.quote.amount,
            currency=purchase.quote.currency)
        purchase.save(update_fields=["customer_key", "basket_fingerprint"])
    shared = (Purchase.objects.values("quote_id").annotate(n=models.Count("id"))
              .filter(n__gt=1).values_list("quote_id", flat=True))
    shared = list(shared[:50])
    if shared:
        raise RuntimeError("these quotes back more than one purchase; review them (possible "
                           f"double charges) before migrating: {shared}")


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0003_bench_settled_at_idx'),
    ]

    operations = [
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
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
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
    ]
