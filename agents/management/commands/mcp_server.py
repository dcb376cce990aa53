"""`python manage.py mcp_server`: Verity's agent tools over MCP stdio (docs/mcp.md).

The API key comes from the environment (`VERITY_API_KEY`), never from the agent. stdout
carries the protocol, so this command writes nothing to it; logs go to stderr.
"""

import os

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from agents.server import API_KEY_ENV, authenticate_key, build_server, drill_from_env


class Command(BaseCommand):
    help = (
        "Serve the agent toolkit over MCP stdio. The API key is read from VERITY_API_KEY. "
        "Test mode only: VERITY_DRILL_NEXT_CONFIRM=<drill mode> arms a fault drill on the "
        "first payment's confirm step."
    )

    def handle(self, *args, **options):
        key = os.environ.get(API_KEY_ENV, "").strip()
        if not key:
            raise CommandError(
                f"set {API_KEY_ENV} to a Verity API key "
                "(python manage.py create_api_client NAME --scopes ...)"
            )
        if authenticate_key(key) is None:
            raise CommandError(f"{API_KEY_ENV} is not a valid (unrevoked) Verity API key")
        try:
            drill = drill_from_env()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        from django.db import connection

        connection.close()  # tools run on worker threads with their own connections
        build_server(api_key=key, before_dispatch=drill).run("stdio")
