from django.core.management.base import BaseCommand, CommandError

from cleanup.bench import measure
from cleanup.bench.progress import Progress
from cleanup.bench.report import json_line, table
from cleanup.bench.scratch import BenchError


def positive(value):
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def non_negative(value):
    number = int(value)
    if number < 0:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Measure the sweep on a scratch PostgreSQL database (eventsite_bench on the configured server, "
        "or BENCH_DATABASE_URL) beside a plain-SQL sweep and a row-at-a-time one."
    )

    def add_arguments(self, parser):
        defaults = measure.Options()
        parser.add_argument("--runs", type=positive, default=defaults.runs, help="ended runs to give back")
        parser.add_argument("--steps", type=positive, default=defaults.steps, help="steps (groups) per run")
        parser.add_argument("--resources", type=positive, default=defaults.resources, help="rows per group")
        parser.add_argument("--history", type=non_negative, default=0, help="resolved rows to seed first")
        parser.add_argument("--workers", type=int, choices=[1, 2], default=1, help="2: also two sweepers at once")
        parser.add_argument("--latency-ms", type=non_negative, default=0, help="the module's delay per call")
        parser.add_argument("--repeats", type=positive, default=defaults.repeats, help="figures are medians")
        parser.add_argument("--json", action="store_true", help="print one JSON line")

    def handle(self, *args, **o):
        options = measure.Options(runs=o["runs"], steps=o["steps"], resources=o["resources"], history=o["history"],
                                  workers=o["workers"], latency_ms=o["latency_ms"], repeats=o["repeats"])
        try:
            result = measure.run(options, Progress(self.stderr._out))
        except BenchError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json_line(result) if o["json"] else table(result))
