"""Agent platform secrets are derived (EVENTS_SECRET_KEY + a salt on the row), not stored.

A platform's secrets stored in clear so far are kept, renamed `legacy_*`: changing them here
would break the platform's verification of its webhooks and its signing of requests at the
deploy. They are used until `acp_platform` rotates them (the rotation empties them), and
the `verity.W001` check lists the platforms still holding one.

Backwards, a platform whose secret is derived gets it written to the old column, so the
code before this migration signs and verifies with the same secret.
"""

from django.db import migrations, models

from events.secrets import derived_secret


def derived_to_stored(apps, schema_editor):
    AgentPlatform = apps.get_model("acp", "AgentPlatform")
    for platform in AgentPlatform.objects.all():
        # The purposes and prefixes of acp.models.AgentPlatform.current_*_secret.
        if platform.webhook_secret_salt and not platform.legacy_webhook_secret:
            platform.legacy_webhook_secret = derived_secret(
                purpose="acp-webhook",
                owner_id=platform.pk,
                salt=platform.webhook_secret_salt,
                prefix="whsec_",
            )
        if platform.signing_secret_salt and not platform.legacy_signing_secret:
            platform.legacy_signing_secret = derived_secret(
                purpose="acp-request",
                owner_id=platform.pk,
                salt=platform.signing_secret_salt,
                prefix="sigsec_",
            )
        platform.save(update_fields=["legacy_webhook_secret", "legacy_signing_secret"])


class Migration(migrations.Migration):

    dependencies = [
        ('acp', '0001_checkout_sessions_and_platforms'),
    ]

    operations = [
        migrations.RenameField(
            model_name='agentplatform',
            old_name='signing_secret',
            new_name='legacy_signing_secret',
        ),
        migrations.RenameField(
            model_name='agentplatform',
            old_name='webhook_secret',
            new_name='legacy_webhook_secret',
        ),
        migrations.AddField(
            model_name='agentplatform',
            name='signing_secret_salt',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='agentplatform',
            name='webhook_secret_salt',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.RunPython(migrations.RunPython.noop, derived_to_stored),
    ]
