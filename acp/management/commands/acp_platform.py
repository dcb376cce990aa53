"""Configure an agent platform (an API client with the `acp` scope): where its order
events go and the secrets they and its requests are signed with.

  manage.py acp_platform <client name> [--webhook-url URL] [--new-webhook-secret]
                                       [--new-signing-secret] [--no-signing]
A new secret is printed once (the platform keeps it); it is stored for signing only.
The order webhooks themselves are delivered by the events app (docs/events.md): this
keeps the platform's `acp` endpoint there at the URL given.
"""

from __future__ import annotations

import secrets

from django.core.management.base import BaseCommand, CommandError

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
        api_client = ApiClient.objects.filter(name=client, revoked=False).first()
        if api_client is None or not api_client.has_scope("acp"):
            raise CommandError(f"no active API client {client!r} with the acp scope")
        platform, _ = AgentPlatform.objects.get_or_create(api_client=api_client)
        if webhook_url is not None:
            if webhook_url and not webhook_url.startswith(("https://", "http://")):
                raise CommandError("--webhook-url must be an http(s) URL")
            platform.webhook_url = webhook_url
        if new_webhook_secret or (platform.webhook_url and not platform.webhook_secret):
            platform.webhook_secret = f"whsec_{secrets.token_urlsafe(32)}"
            self.stdout.write(f"webhook secret (shown once): {platform.webhook_secret}")
        if new_signing_secret:
            platform.signing_secret = f"sigsec_{secrets.token_urlsafe(32)}"
            self.stdout.write(f"request signing secret (shown once): {platform.signing_secret}")
        if no_signing:
            platform.signing_secret = ""
        platform.save()
        # Its order webhooks are deliveries on an `acp` endpoint of the events app: kept at
        # this URL (turned off when it is cleared), shown in the console's delivery log.
        platform_endpoint_sync(platform)
        self.stdout.write(
            f"platform {client}: webhook={platform.webhook_url or '-'} "
            f"signing={'on' if platform.signing_secret else 'off'}"
        )
