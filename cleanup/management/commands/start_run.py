import json

from django.core.management.base import BaseCommand, CommandError

from cleanup.runner import RunSpecError, start_run


class Command(BaseCommand):
    help = 'Start a run: --name NAME --steps \'[{"action": "...", "params": {...}}, ...]\'.'

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--steps", required=True, help="a JSON list of {action, params}")
        parser.add_argument("--actor", default="command")

    def handle(self, *args, name, steps, actor, **options):
        try:
            spec = json.loads(steps)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--steps is not valid JSON: {exc}") from None
        try:
            run = start_run(name, spec, actor=actor)
        except RunSpecError as exc:
            raise CommandError(f"the run was not started: {exc}") from None
        self.stdout.write(f"started run {run.pk} ({run.name}) with {run.steps.count()} step(s)")
