"""Manage an API client's webhook endpoints from the shell (docs/events.md).

  python manage.py webhook_endpoint create --client NAME --url https://… [--types a,b]
  python manage.py webhook_endpoint list --client NAME
  python manage.py webhook_endpoint disable|enable ENDPOINT_ID --reason "…"
  python manage.py webhook_endpoint rotate ENDPOINT_ID [--overlap-seconds 86400]
create and rotate print the signing secret once, as their last line.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from events import selectors, services
from events.models import WebhookEndpoint
from payments.models import ApiClient


class Command(BaseCommand):
    help = "Create, list, disable, enable or rotate the secret of webhook endpoints."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["create", "list", "disable", "enable", "rotate"])
        parser.add_argument("endpoint", nargs="?", help="endpoint id (disable/enable/rotate)")
        parser.add_argument("--client", help="the API client's name or key prefix (create/list)")
        parser.add_argument("--url")
        parser.add_argument("--types", default="", help="comma-separated; empty: every type")
        parser.add_argument("--reason", default="")
        parser.add_argument("--overlap-seconds", type=int, default=86400)
        parser.add_argument("--actor", default="cli")

    def _client(self, prefix: str | None) -> ApiClient:
        client = (
            ApiClient.objects.filter(Q(prefix=prefix) | Q(name=prefix)).order_by("-created").first()
            if prefix
            else None
        )
        if client is None:
            raise CommandError("--client must name an API client (its name or key prefix)")
        return client

    def _endpoint(self, endpoint_id: str | None) -> WebhookEndpoint:
        endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id).first()
        if endpoint is None:
            raise CommandError("no such endpoint")
        return endpoint

    def handle(
        self, *args, action, endpoint, client, url, types, reason, overlap_seconds, actor, **options
    ):
        try:
            if action == "create":
                made = services.endpoint_create(
                    api_client_id=self._client(client).pk,
                    url=url or "",
                    event_types=[t for t in types.split(",") if t],
                    actor=actor,
                )
                self.stdout.write(f"endpoint {made.endpoint.id} -> {made.endpoint.url}")
                self.stdout.write(made.secret)
            elif action == "list":
                for e in selectors.endpoints_for_client(self._client(client).pk):
                    state = "enabled" if e.enabled else f"disabled ({e.disabled_reason})"
                    self.stdout.write(f"{e.id} {e.url} {','.join(e.event_types) or '*'} {state}")
            elif action in ("disable", "enable"):
                e = services.endpoint_update(
                    endpoint=self._endpoint(endpoint),
                    actor=actor,
                    enabled=action == "enable",
                    reason=reason,
                )
                self.stdout.write(f"endpoint {e.id} {'enabled' if e.enabled else 'disabled'}")
            else:
                made = services.endpoint_rotate_secret(
                    endpoint=self._endpoint(endpoint),
                    actor=actor,
                    overlap_seconds=overlap_seconds,
                    reason=reason,
                )
                self.stdout.write(
                    f"endpoint {made.endpoint.id}: new secret; the old one signs "
                    f"too for {overlap_seconds} s"
                )
                self.stdout.write(made.secret)
        except services.EndpointError as exc:
            raise CommandError(str(exc)) from None
