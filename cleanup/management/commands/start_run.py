"""``manage.py start_run --name NAME --steps JSON``: start a run (`cleanup.runner.start_run`).

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

from typing import Any

from django.core.management.base import CommandError, CommandParser

from cleanup import validation
from cleanup.management.base import EventCommand, plain_text
from cleanup.runner import start_run


class Command(EventCommand):
    help = 'Start a run: --name NAME --steps \'[{"action": "...", "params": {...}}, ...]\'.'

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True)
        parser.add_argument("--steps", required=True, help="a JSON list of {action, params}")
        parser.add_argument("--actor", default="command", type=plain_text)

    def handle(self, *args: Any, name: str, steps: Any, actor: str, **options: Any) -> None:
        try:
            run = start_run(name, validation.parse_json(steps, "--steps"), actor=actor)
        except validation.Invalid as exc:  # the JSON, or the run it describes (RunSpecError)
            raise CommandError(f"the run was not started: {exc}") from None
        self.stdout.write(f"started run {run.pk} ({run.name}) with {run.steps.count()} step(s)")
