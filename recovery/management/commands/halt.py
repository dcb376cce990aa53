"""python manage.py halt {set,clear,list} [NAME] --reason ... --actor ..."""

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.halts import HaltError, halt_clear, halt_set, valid_halt_names
from recovery.selectors import halts_list


class Command(BaseCommand):
    help = "Pause or resume a workflow (checkout, refunds) or a step (step:<name>)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["set", "clear", "list"])
        parser.add_argument("name", nargs="?", help=", ".join(valid_halt_names()))
        parser.add_argument("--reason", default="")
        parser.add_argument("--actor", default="")

    def handle(
        self, *args: Any, action: str, name: str | None, reason: str, actor: str, **options: Any
    ) -> None:
        if action == "list":
            for halt in halts_list():
                since = halt.created_at.strftime("%Y-%m-%d %H:%M")
                self.stdout.write(f"{halt.name}\t{halt.halted_by}\t{since}\t{halt.reason}")
            return
        if not name:
            raise CommandError("a halt name is required")
        actor = actor or f"cli:{getpass.getuser()}"
        try:
            if action == "set":
                halt_set(name=name, reason=reason, actor=actor)
                self.stdout.write(f"halted {name}")
            else:
                cleared = halt_clear(name=name, actor=actor, reason=reason)
                self.stdout.write(f"cleared {name}" if cleared else f"{name} was not halted")
        except HaltError as exc:
            raise CommandError(str(exc)) from exc
