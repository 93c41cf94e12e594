"""``manage.py cancel_run RUN_ID [--no-cleanup]``: end a running run (`cleanup.runner.cancel_run`).

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

from typing import Any

from django.core.management.base import CommandError, CommandParser

from cleanup.management.base import EventCommand, object_id, plain_text
from cleanup.models import Run
from cleanup.runner import RunStateError, cancel_run


class Command(EventCommand):
    help = "Cancel a running run; its cleanup is queued unless --no-cleanup."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", type=object_id)
        parser.add_argument(
            "--no-cleanup",
            action="store_true",
            help="leave what the run took in place, visible, until a person asks for its cleanup",
        )
        parser.add_argument("--actor", default="command", type=plain_text)

    def handle(self, *args: Any, run_id: int, no_cleanup: bool = False, actor: str = "command", **options: Any) -> None:
        try:
            run = cancel_run(run_id, cleanup=not no_cleanup, actor=actor)
        except Run.DoesNotExist:
            raise CommandError(f"there is no run {run_id}") from None
        except RunStateError as exc:
            raise CommandError(str(exc)) from None
        then = "its cleanup is queued" if not no_cleanup else "its resources stay until a person cleans it up"
        self.stdout.write(f"cancelled run {run.pk}; {then} (cleanup {run.cleanup_status})")
