"""``manage.py prune``: delete what ended past the retention window (`cleanup.retention`).

May import: the engine's entry points: the work is theirs, not the command's.
"""

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from cleanup.conf import setting
from cleanup.management.base import EventCommand
from cleanup.retention import Archive, prune


def days(text: str) -> int:
    if not text.isdecimal() or int(text) > 36_500:
        raise argparse.ArgumentTypeError(f"days is a whole number from 0 to 36500, got {text!r}")
    return int(text)


class Command(EventCommand):
    help = (
        "Delete runs that ended more than EVENT_RETENTION_DAYS ago with nothing unresolved, with their "
        "steps, ledger rows, attempts, log and alerts, in batches of EVENT_PRUNE_BATCH runs; and the "
        "modules' log and sent alerts older than that."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="say what would be deleted and delete nothing")
        parser.add_argument(
            "--older-than",
            type=days,
            metavar="DAYS",
            help="the retention window for this run, in days, instead of EVENT_RETENTION_DAYS",
        )
        parser.add_argument(
            "--archive",
            metavar="FILE",
            help="append what is deleted to FILE first, one JSON object per run and line (gzip when it ends in .gz)",
        )

    def handle(
        self,
        *args: Any,
        dry_run: bool = False,
        older_than: int | None = None,
        archive: str | None = None,
        **options: Any,
    ) -> None:
        window = setting("EVENT_RETENTION_DAYS") if older_than is None else older_than
        if not window:
            self.stdout.write("retention is 0 days (keep everything): nothing to prune")
            return
        if archive and dry_run:
            raise CommandError("--archive writes what is deleted; a --dry-run deletes nothing")
        sink = None
        if archive:
            try:
                sink = Archive(archive)
            except OSError as exc:
                raise CommandError(f"--archive: cannot write {archive}: {exc.strerror}") from exc
        try:
            result = prune(days=window, dry_run=dry_run, archive=sink)
        finally:
            if sink is not None:
                sink.close()
        self.stdout.write(result.line() + (f"; archived to {archive}" if archive and result.runs else ""))
