"""Configure an agent platform (an API client with the `acp` scope): where its order
events go and the secrets they and its requests are signed with.

  manage.py acp_platform <client name> [--webhook-url URL] [--new-webhook-secret]
                                       [--new-signing-secret] [--no-signing]
A new secret is printed once (the platform keeps it). It is never stored: it is derived
from EVENTS_SECRET_KEY and a salt kept on the platform's row (acp.models.AgentPlatform), so
a new salt is a new secret. A secret stored in clear before secrets were derived keeps
working until it is rotated here (which forgets it).
The order webhooks themselves are delivered by the events app (docs/events.md): this
keeps the platform's `acp` endpoint there at the URL given.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from events.models import new_secret_salt
from payments.models import ApiClient

from ...handlers import platform_endpoint_sync
from ...models import AgentPlatform


class Command(BaseCommand):
    help = "Set an ACP agent platform's webhook URL and secrets."

    def add_arguments(self, parser):
        parser.add_argument("client")
        parser.add_argument("--webhook-url", default=None)
        parser.add_argument("--new-webhook-secret", action="store_true")
        parser.add_argument("--new-signing-secret", action="store_true")
        parser.add_argument("--no-signing", action="store_true")

    def handle(
        self,
        *args,
        client,
        webhook_url,
        new_webhook_secret,
        new_signing_secret,
        no_signing,
        **options,
    ):
        if new_signing_secret and no_signing:
            raise CommandError("--new-signing-secret and --no-signing contradict each other")
        api_client = ApiClient.objects.filter(name=client, revoked=False).first()
        if api_client is None or not api_client.has_scope("acp"):
            raise CommandError(f"no active API client {client!r} with the acp scope")
        platform, _ = AgentPlatform.objects.get_or_create(api_client=api_client)
        if webhook_url is not None:
            if webhook_url and not webhook_url.startswith(("https://", "http://")):
                raise CommandError("--webhook-url must be an http(s) URL")
            platform.webhook_url = webhook_url
        shown = []
        if new_webhook_secret or (platform.webhook_url and not platform.current_webhook_secret()):
            platform.webhook_secret_salt = new_secret_salt()
            platform.legacy_webhook_secret = ""
            shown.append("webhook")
        if new_signing_secret:
            platform.signing_secret_salt = new_secret_salt()
            platform.legacy_signing_secret = ""
            shown.append("request signing")
        if no_signing:
            platform.signing_secret_salt = ""
            platform.legacy_signing_secret = ""
        platform.save()
        # Shown once, after the save that makes it the one in use; never logged.
        if "webhook" in shown:
            self.stdout.write(f"webhook secret (shown once): {platform.current_webhook_secret()}")
        if "request signing" in shown:
            self.stdout.write(
                f"request signing secret (shown once): {platform.current_signing_secret()}"
            )
        # Its order webhooks are deliveries on an `acp` endpoint of the events app: kept at
        # this URL (turned off when it is cleared), shown in the console's delivery log.
        platform_endpoint_sync(platform)
        self.stdout.write(
            f"platform {client}: webhook={platform.webhook_url or '-'} "
            f"signing={'on' if platform.current_signing_secret() else 'off'}"
        )
        stored = [
            flag
            for flag, value in (
                ("--new-webhook-secret", platform.legacy_webhook_secret),
                ("--new-signing-secret", platform.legacy_signing_secret),
            )
            if value
        ]
        if stored:
            self.stdout.write(
                "a secret stored in the database before secrets were derived is still in "
                f"use; rotate it ({' '.join(stored)}) once the platform can take a new one"
            )
