from django.db import migrations


class Migration(migrations.Migration):
    """An operation made outside Verity is *reviewed* by a person; "acknowledged" stays the
    grade of an outcome settled on a person's word (one word, one meaning)."""

    dependencies = [
        ("payments", "0008_acp_channel"),
    ]

    operations = [
        migrations.RenameField(model_name="paymentoperation", old_name="acknowledged_at",
                               new_name="reviewed_at"),
        migrations.RenameField(model_name="paymentoperation", old_name="acknowledged_by",
                               new_name="reviewed_by"),
    ]
