"""Purchase.channel names every way in (REST API, MCP, ACP, operator drills), not only
ACP. Purchases opened before it are labelled from what they left behind: an MCP
create_purchase's idempotency record, or the fault-drill client; the rest stay `api`."""

from django.db import migrations, models


def label_earlier_purchases(apps, schema_editor):
    Purchase = apps.get_model("payments", "Purchase")
    IdempotencyRecord = apps.get_model("payments", "IdempotencyRecord")
    mcp = (IdempotencyRecord.objects.filter(route="mcp.create_purchase",
                                            resource_type="purchase")
           .values("resource_id"))
    Purchase.objects.filter(channel="api", id__in=mcp).update(channel="mcp")
    Purchase.objects.filter(channel="api", api_client__name="fault-drill").update(
        channel="drill")


class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0010_console_query_indexes_in_models'),
    ]

    operations = [
        migrations.AlterField(
            model_name='purchase',
            name='channel',
            field=models.CharField(choices=[('api', 'Shop checkout (REST API)'), ('mcp', 'AI agent (MCP)'), ('acp', 'AI agent (Agentic Commerce Protocol)'), ('drill', 'Operator drill')], default='api', max_length=16),
        ),
        migrations.RunPython(label_earlier_purchases, migrations.RunPython.noop),
    ]
