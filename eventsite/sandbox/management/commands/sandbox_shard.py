from django.core.management.base import BaseCommand, CommandError

from eventsite.sandbox import shard


class Command(BaseCommand):
    help = (
        "Run the sandbox shard: a stand-in game shard over HTTP on loopback, with its world "
        "in memory, periodic saves, restarts and fault injection (see eventsite.sandbox.shard)."
    )
    requires_system_checks = []  # the shard needs neither the database nor the models

    def add_arguments(self, parser):
        shard.add_arguments(parser)

    def handle(self, *args, **options):
        problem = shard.check_arguments(options["port"], options["save_every"])
        if problem:
            raise CommandError(problem)
        try:
            shard.serve(options["host"], options["port"], options["save_every"], out=self.stdout)
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc}") from None
