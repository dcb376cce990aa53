"""System check: agent platforms still signing with a secret stored in the database.

Platform secrets are derived from EVENTS_SECRET_KEY and a salt (acp.models.AgentPlatform);
one stored in clear by the code before that is kept, so the platform's verification does
not break at the migration, and used until `acp_platform` rotates it. This lists the
platforms that still hold one, so an operator sees them at deploy (`manage.py migrate`, and
`manage.py check --database default`: database checks run only when a database is named).
"""

from __future__ import annotations

from django.core import checks
from django.db import connections

from .models import AgentPlatform


def _table_has_legacy_columns(alias: str) -> bool:
    """False before the migration that adds them (a deploy's migrate checks first)."""
    connection = connections[alias]
    table = AgentPlatform._meta.db_table
    with connection.cursor() as cursor:
        if table not in connection.introspection.table_names(cursor):
            return False
        columns = {c.name for c in connection.introspection.get_table_description(cursor, table)}
    return {"legacy_webhook_secret", "legacy_signing_secret"} <= columns


@checks.register(checks.Tags.database)
def platforms_with_stored_secrets(app_configs=None, databases=None, **kwargs):
    found = []
    for alias in databases or ():
        if not _table_has_legacy_columns(alias):
            continue
        rows = (
            AgentPlatform.objects.using(alias)
            .exclude(legacy_webhook_secret="", legacy_signing_secret="")
            .select_related("api_client")
            .order_by("id")
        )
        for platform in rows:
            which = [
                kind
                for kind, value in (
                    ("webhook", platform.legacy_webhook_secret),
                    ("request signing", platform.legacy_signing_secret),
                )
                if value
            ]
            found.append(f"{platform.api_client.name} ({', '.join(which)})")
    if not found:
        return []
    return [
        checks.Warning(
            "Agent platforms with a secret stored in the database (used until rotated): "
            + "; ".join(found),
            hint="Rotate each with `manage.py acp_platform NAME --new-webhook-secret` and/or "
            "`--new-signing-secret` (the new secret is shown once and never stored), then "
            "give it to the platform.",
            id="verity.W001",
        )
    ]
