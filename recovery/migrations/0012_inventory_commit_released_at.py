from django.db import migrations, models


class Migration(migrations.Migration):
    """Stock goes back to the shelf once when a purchase's money went back (goods follow the
    money): the commit records when it was released."""

    dependencies = [
        ("recovery", "0011_outbox_due_index_and_autovacuum"),
    ]

    operations = [
        migrations.AddField(
            model_name="inventorycommit",
            name="released_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
