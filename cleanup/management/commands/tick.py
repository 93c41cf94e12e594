from cleanup.management.base import EventCommand
from cleanup.runner import tick
from cleanup.tasks import notice_staff


class Command(EventCommand):
    help = "Run one tick: advance running runs, then give back what ended runs hold."

    def handle(self, *args, **options):
        self.stdout.write(tick(by="command").line())
        notice_staff()  # alerts, as the queue's tick sends them
