from django.core.management.base import CommandError

from cleanup.management.base import EventCommand, object_id, plain_text
from cleanup.models import Run
from cleanup.sweep import CleanupRefused, cleanup_run


class Command(EventCommand):
    help = "Give back what one ended run still holds, now."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=object_id)
        parser.add_argument(
            "--reset",
            action="store_true",
            help="a person's retry: put every unresolved row back under the attempt ceiling",
        )
        parser.add_argument("--actor", default=None, type=plain_text, help="who asks (logged with --reset)")

    def handle(self, *args, run_id, reset=False, actor=None, **options):
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"there is no run {run_id}")
        try:
            summary = cleanup_run(run, reset=reset, actor=actor or "command", by="command")
        except CleanupRefused as exc:
            raise CommandError(str(exc)) from None
        run.refresh_from_db()
        self.stdout.write(
            f"run {run.pk}: attempted {summary.attempted}, reverted {summary.reverted}, "
            f"drifted {summary.drifted}, failed {summary.failed}, remaining {summary.remaining}; "
            f"cleanup {run.cleanup_status}"
        )
