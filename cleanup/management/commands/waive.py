"""``manage.py waive``: a person resolves rows by hand (`cleanup.manual.waive`).

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

from typing import Any

from django.core.management.base import CommandError, CommandParser

from cleanup.management.base import EventCommand
from cleanup.manual import waive
from cleanup.models import Resource, Run

MAX_ID = 2**63 - 1  # the largest id the database holds


class Command(EventCommand):
    help = "Resolve unresolved ledger rows by hand (waived), with a reason and who decided."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", nargs="?", type=int, help="waive every unresolved row of this run")
        parser.add_argument(
            "--row",
            type=int,
            action="append",
            dest="rows",
            metavar="ID",
            help="waive this ledger row (repeat for several) instead of a whole run",
        )
        parser.add_argument("--reason", required=True, help="why nobody will give it back")
        parser.add_argument("--actor", required=True, help="who decided (logged)")

    def handle(
        self,
        *args: Any,
        run_id: int | None = None,
        rows: list[int] | None = None,
        reason: str,
        actor: str,
        **options: Any,
    ) -> None:
        if (run_id is None) == (not rows):
            raise CommandError("give either a RUN_ID or --row ID, not both and not neither")
        if not reason.strip():
            raise CommandError("--reason must say why")
        if not actor.strip():
            raise CommandError("--actor must name who decided")
        if run_id is not None:
            if not Run.objects.filter(pk=run_id).exists():
                raise CommandError(f"there is no run {run_id}")
            found = list(Resource.objects.filter(run_id=run_id).unresolved())
        else:
            ids = rows or []
            if any(not 1 <= pk <= MAX_ID for pk in ids):
                raise CommandError(f"a ledger row id is a whole number from 1 to {MAX_ID}")
            found = list(Resource.objects.filter(pk__in=ids))
            missing = sorted(set(ids) - {r.pk for r in found})
            if missing:
                raise CommandError(f"there is no ledger row {', '.join(map(str, missing))}")
        waived = waive(found, reason, actor.strip())
        self.stdout.write(
            f"waived {waived} of {len(found)} row(s)"
            + ("" if waived == len(found) else "; the others are resolved already or held by a sweeper now")
        )
