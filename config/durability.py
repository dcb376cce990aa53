"""Deploy check: PostgreSQL keeps every commit Verity has answered for.

Verity answers a storefront, an agent or the provider's webhook only after its transaction
commits, and the provider never redelivers an event that got a 2xx. With
`synchronous_commit = off` a commit can be acknowledged up to three WAL-writer delays before
it is on disk, and a server crash (or `pg_ctl stop -m immediate`) loses it: an accepted
refund event then vanishes with nobody left to send it again (a throwaway cluster lost
exactly this in a crash test). `fsync = off` loses commits when the machine
crashes. Both are fine for a test database and never for a payments one.

`manage.py check --deploy --database default` runs it (database checks run only when a
database is named).
"""

from __future__ import annotations

from django.core import checks
from django.db import connections

UNSAFE = {"synchronous_commit": ("off",), "fsync": ("off",)}


@checks.register(checks.Tags.database, deploy=True)
def database_keeps_acknowledged_commits(app_configs=None, databases=None, **kwargs):
    problems = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        with connection.cursor() as cursor:
            for setting, bad in UNSAFE.items():
                cursor.execute(f"SHOW {setting}")
                value = cursor.fetchone()[0]
                if value in bad:
                    problems.append(
                        checks.Error(
                            f"PostgreSQL {setting} = {value} on database '{alias}': a commit "
                            "Verity already answered for can be lost in a crash.",
                            hint=f"Set {setting} = on (the PostgreSQL default) for Verity's "
                            "database.",
                            id="verity.E001" if setting == "synchronous_commit" else "verity.E002",
                        )
                    )
    return problems
