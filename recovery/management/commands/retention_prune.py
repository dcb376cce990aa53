"""python manage.py retention_prune [--table T] [--batch-size N] [--max-batches N] [--json]

What the beat task `recovery.retention_prune` runs every RETENTION_SWEEP_SECONDS, on
demand: one run of every table's policy (docs/retention.md), or one table's."""

import json as _json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.retention import POLICIES, policy_for, retention_prune_table


class Command(BaseCommand):
    help = "Prune the append-heavy tables past their retention (batched, lock-light)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--table", choices=[p.table for p in POLICIES])
        parser.add_argument("--batch-size", type=int)
        parser.add_argument("--max-batches", type=int)
        parser.add_argument("--json", action="store_true", help="one JSON object per table")

    def handle(
        self,
        *args: Any,
        table: str | None,
        batch_size: int | None,
        max_batches: int | None,
        json: bool = False,
        **options: Any,
    ) -> None:
        if batch_size is not None and batch_size < 1 or max_batches is not None and max_batches < 1:
            raise CommandError("--batch-size and --max-batches must be at least 1")
        policies = [policy_for(table)] if table else list(POLICIES)
        for policy in policies:
            r = retention_prune_table(policy=policy, batch_size=batch_size, max_batches=max_batches)
            if json:
                self.stdout.write(_json.dumps(r.__dict__))
            else:
                self.stdout.write(
                    f"{r.table}: {r.pruned} pruned ({'archived' if policy.archive else 'deleted'}),"
                    f" {r.due} still due, {r.kept} kept, {r.batches} batch(es), {r.seconds:.2f}s"
                )
