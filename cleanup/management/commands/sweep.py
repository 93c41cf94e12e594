"""``manage.py sweep``: the cleanup leg once (`cleanup.sweep.sweep`).

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

from typing import Any

from cleanup.management.base import EventCommand
from cleanup.sweep import sweep
from cleanup.tasks import notice_staff


class Command(EventCommand):
    help = "Run the cleanup leg once: give back what ended runs still hold."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(sweep(by="command").line())
        notice_staff()  # alerts, as the queue's sweep sends them
