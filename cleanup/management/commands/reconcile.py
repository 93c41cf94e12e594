"""``manage.py reconcile [--module NAME] [--restarted]``: ask modules what is in force (`cleanup.reconcile`).

As after a restart, it pays the reconcile each backend it covers owes (`reconcile.reconcile`).

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

from typing import Any

from django.core.management.base import CommandError, CommandParser

from cleanup.management.base import EventCommand, plain_text
from cleanup.reconcile import UnknownModule, reconcile, reconcile_all


class Command(EventCommand):
    help = "Ask modules which ledgered resources are still in the world."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--module", type=plain_text, help="reconcile this module only (default: every module)")
        parser.add_argument(
            "--restarted",
            action="store_true",
            help="as after a backend restart: also ask about recently given-back resources",
        )

    def handle(self, *args: Any, module: str | None = None, restarted: bool = False, **options: Any) -> None:
        if module is not None:
            try:
                summary = reconcile(module, restarted=restarted)
            except UnknownModule as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(summary.line(module))
            return
        results = reconcile_all(restarted=restarted)
        if not results:
            self.stdout.write("reconciled 0 modules: no live rows")
            return
        self.stdout.write(
            f"reconciled {len(results)} module(s): "
            + "; ".join(summary.line(name) for name, summary in results.items())
        )
