from django.core.management.base import BaseCommand

from cleanup.runner import tick


class Command(BaseCommand):
    help = "Run one tick: advance running runs, then give back what ended runs hold."

    def handle(self, *args, **options):
        self.stdout.write(tick(by="command").line())
