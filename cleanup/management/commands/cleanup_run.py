"""``manage.py cleanup_run RUN_ID [--reset] [--now]``: one run's cleanup pass (`cleanup.sweep.cleanup_run`).

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import Count, Min
from django.utils import timezone

from cleanup import rows as ledger_rows
from cleanup.conf import max_revert_attempts
from cleanup.management.base import EventCommand, object_id, plain_text
from cleanup.manual import check_cleanup
from cleanup.models import Resource, Run
from cleanup.sweep import CleanupRefused, cleanup_run


class Command(EventCommand):
    help = (
        "Give back what one ended run still holds, within its attempt ceiling. Rows waiting "
        "for their backoff wait, unless --now; rows at the ceiling need --reset."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", type=object_id)
        parser.add_argument(
            "--reset",
            action="store_true",
            help="a person's retry: put every unresolved row back under the attempt ceiling",
        )
        parser.add_argument(
            "--now",
            action="store_true",
            help="do not wait for the backoff of failed rows (their attempt counters stay)",
        )
        parser.add_argument("--actor", default=None, type=plain_text, help="who asks (logged with --reset)")

    def handle(
        self, *args: Any, run_id: int, reset: bool = False, now: bool = False, actor: str | None = None, **options: Any
    ) -> None:
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"there is no run {run_id}")
        if now and run.is_terminal:
            ledger_rows.hurry(Resource.objects.filter(run=run), max_revert_attempts())
        try:
            if reset:
                check_cleanup(run)  # a person's retry of a run that owes nothing changes nothing
            summary = cleanup_run(run, reset=reset, actor=actor or "command", by="command")
        except CleanupRefused as exc:
            raise CommandError(str(exc)) from None
        run.refresh_from_db()
        self.stdout.write(
            f"run {run.pk}: attempted {summary.attempted}, reverted {summary.reverted}, "
            f"drifted {summary.drifted}, failed {summary.failed}, remaining {summary.remaining}; "
            f"cleanup {run.cleanup_status}"
        )
        self.say_what_waits(run)

    def say_what_waits(self, run: Run) -> None:
        rows, ceiling, at = Resource.objects.filter(run=run), max_revert_attempts(), timezone.now()
        waiting = rows.filter(ledger_rows.backing_off(at, ceiling)).aggregate(
            n=Count("id"), until=Min("next_attempt_at")
        )
        if waiting["n"]:
            until = waiting["until"].isoformat(timespec="seconds")
            self.stdout.write(
                f"{waiting['n']} row(s) wait for their backoff, the first until {until}; --now tries them now"
            )
        stuck = rows.unresolved().exclude(ledger_rows.tried_again(at, ceiling)).count()
        if stuck:
            self.stdout.write(
                f"{stuck} row(s) wait for a person (no attempt left, or refused for good); --reset tries them again"
            )
