"""``manage.py tick``: one tick, advance then cleanup (`cleanup.runner.tick`).

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

from typing import Any

from cleanup.management.base import EventCommand
from cleanup.runner import tick
from cleanup.tasks import notice_staff


class Command(EventCommand):
    help = "Run one tick: advance running runs, then give back what ended runs hold."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(tick(by="command").line())
        notice_staff()  # alerts, as the queue's tick sends them
