import argparse

from django.core.management.base import BaseCommand, CommandError

from eventsite.bench import beside_prune, fleet_night, measure, night, scrape
from eventsite.bench.progress import Progress
from eventsite.bench.report import fleet_table, json_line, night_table, prune_table, scrape_table, table
from eventsite.bench.scratch import BenchError


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


# A shard is a process of its own: about 21 MB resident and 0.2 s of CPU to start, two
# file descriptors of the bench's and a port from the system's ephemeral range. 200 of them
# take 4 GB and about 20 s to start on two cores; beyond that the machine measures itself.
FLEET_MAX = 200


def fleet_size(value):
    number = int(value)
    if not 2 <= number <= FLEET_MAX:
        raise argparse.ArgumentTypeError(
            f"N is the number of shards, 2 to {FLEET_MAX} (one down and one healthy at least): got {number}"
        )
    return number


def seconds(value):
    number = float(value)
    if not 0 <= number <= 3600:
        raise ValueError(value)
    return number


SWEEP = measure.Options()
NIGHT = night.NightOptions()
# Options of one mode only; given in the other they are refused rather than ignored.
SWEEP_ONLY = ("runs", "steps", "resources", "history", "workers", "latency_ms")
NIGHT_ONLY = ("samples", "night_runs", "night_steps", "creatures", "long_steps", "shard_latency_ms", "fleet")
# Options of the fleet night only (--night --fleet N); the one-shard night refuses them.
FLEET_ONLY = ("fleet_down", "back_after_s", "tick_every_s")
SCRAPE = scrape.ScrapeOptions()
PRUNE = beside_prune.PruneOptions()
# What --scrape and --beside-prune take; any other option of the sweep's is refused there.
MODES = {
    "scrape": ("runs", "steps", "resources", "history", "repeats"),
    "beside_prune": ("runs", "steps", "resources", "prune_runs", "repeats"),
}


class Command(BaseCommand):
    help = (
        "Measure the sweep on a scratch PostgreSQL database (eventsite_bench on the configured server, "
        "or BENCH_DATABASE_URL) beside a plain-SQL sweep and a row-at-a-time one; with --night, how soon "
        "runs that end are given back by a real django-q2 cluster against a real sandbox shard (in "
        "eventsite_bench_night, or BENCH_DATABASE_URL)."
    )

    def add_arguments(self, parser):
        sweep = parser.add_argument_group("the sweep beside plain SQL and row at a time")
        sweep.add_argument("--runs", type=positive, help=f"ended runs to give back ({SWEEP.runs})")
        sweep.add_argument("--steps", type=positive, help=f"steps (groups) per run ({SWEEP.steps})")
        sweep.add_argument("--resources", type=positive, help=f"rows per group ({SWEEP.resources})")
        sweep.add_argument("--history", type=non_negative, help="resolved rows to seed first (0)")
        sweep.add_argument("--workers", type=int, choices=[1, 2], help="2: also two sweepers at once (1)")
        sweep.add_argument("--latency-ms", type=non_negative, help="the module's delay per call (0)")
        nights = parser.add_argument_group("--night: time to clean, a big night and one long run")
        nights.add_argument(
            "--night",
            action="store_true",
            help="start a sandbox shard and `manage.py qcluster` and time how soon ended runs are "
            "given back (ORM broker, or Redis when REDIS_URL is set; Q_POLL applies)",
        )
        nights.add_argument(
            "--samples",
            type=positive,
            help=f"time to clean: one-creature runs ended one at a time, idle ({NIGHT.samples})",
        )
        nights.add_argument("--night-runs", type=positive, help=f"big night: runs ended together ({NIGHT.runs})")
        nights.add_argument("--night-steps", type=positive, help=f"big night: spawns (groups) per run ({NIGHT.steps})")
        nights.add_argument(
            "--creatures",
            type=positive,
            help=f"creatures (rows) per spawn, in the big night and the long run ({NIGHT.creatures})",
        )
        nights.add_argument(
            "--long-steps", type=positive, help=f"the long run: its spawns (groups), one run alone ({NIGHT.long_steps})"
        )
        nights.add_argument(
            "--shard-latency-ms",
            type=non_negative,
            help=f"the shard's delay per answer while runs are given back ({NIGHT.latency_ms})",
        )
        fleet = parser.add_argument_group("--night --fleet N: a fleet night, shards down")
        fleet.add_argument(
            "--fleet",
            type=fleet_size,
            metavar="N",
            help=f"start N shards (2..{FLEET_MAX}) and measure a fleet night instead: the night with no shard "
            "down beside the same night with the last shards down, and an idle restart (see docs/benchmarks.md)",
        )
        fleet.add_argument(
            "--fleet-down",
            type=int,
            metavar="K",
            help=f"the last K shards are down all night, 1 <= K < N ({NIGHT.fleet_down})",
        )
        fleet.add_argument(
            "--back-after-s",
            type=non_negative,
            help=f"the down shard comes back this many seconds after the runs end ({NIGHT.back_after_s})",
        )
        fleet.add_argument(
            "--tick-every-s",
            type=seconds,
            help="while waiting for the return and the restart to be noticed, queue a tick this often; "
            f"0: only the schedule's, once a minute ({NIGHT.tick_every_s:g})",
        )
        metrics = parser.add_argument_group("--scrape, --beside-prune: the costs of years in production")
        metrics.add_argument(
            "--scrape",
            action="store_true",
            help="time a /metrics scrape, metric by metric, after a bad night, without history and beside "
            f"--history resolved rows ({SCRAPE.history:,}); --runs, --steps and --resources size the night "
            f"({SCRAPE.runs} x {SCRAPE.steps} x {SCRAPE.resources}); medians of --repeats scrapes ({SCRAPE.repeats})",
        )
        metrics.add_argument(
            "--beside-prune",
            action="store_true",
            help="the sweep's speed alone and beside a pruning run of --prune-runs runs past the retention "
            f"window, in turn; medians of --repeats each ({PRUNE.repeats})",
        )
        metrics.add_argument(
            "--prune-runs",
            type=positive,
            help="--beside-prune: runs past the window, 20 rows each (one scheduled pruning run's worth: "
            "EVENT_PRUNE_BATCH x 20)",
        )
        parser.add_argument(
            "--repeats",
            type=positive,
            help=f"figures are medians of this many ({SWEEP.repeats}; with --night, of the big night and the long run)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON line")

    def handle(self, *args, **o):
        if o["scrape"] or o["beside_prune"]:
            return self.handle_costs(o)
        if o["prune_runs"] is not None:
            raise CommandError("--prune-runs applies only with --beside-prune")
        wrong = [name for name in (NIGHT_ONLY if not o["night"] else SWEEP_ONLY) if o[name] is not None]
        if wrong:
            option = "--" + wrong[0].replace("_", "-")
            raise CommandError(f"{option} applies {'only with' if not o['night'] else 'without'} --night")
        wrong = [name for name in FLEET_ONLY if o[name] is not None and o["fleet"] is None]
        if wrong:
            raise CommandError(f"--{wrong[0].replace('_', '-')} applies only with --night --fleet N")
        wrong = [name for name in ("samples", "long_steps") if o[name] is not None and o["fleet"] is not None]
        if wrong:
            raise CommandError(f"--{wrong[0].replace('_', '-')} applies to the one-shard night, not with --fleet")
        if o["fleet_down"] is not None and not 1 <= o["fleet_down"] < o["fleet"]:
            raise CommandError(
                f"--fleet-down K is how many of the {o['fleet']} shards are down, 1 <= K < {o['fleet']} "
                f"(one healthy shard at least): got {o['fleet_down']}"
            )
        progress = Progress(self.stderr._out)
        try:
            if o["fleet"] is not None:
                result = fleet_night.run(self.night_options(o), progress)
            elif o["night"]:
                result = night.run(self.night_options(o), progress)
            else:
                result = measure.run(self.sweep_options(o), progress)
        except BenchError as exc:
            raise CommandError(str(exc)) from None
        shown = fleet_table if o["fleet"] is not None else night_table if o["night"] else table
        self.stdout.write(json_line(result) if o["json"] else shown(result))

    def handle_costs(self, o):
        mode = "scrape" if o["scrape"] else "beside_prune"
        flag = "--" + mode.replace("_", "-")
        if o["scrape"] and o["beside_prune"]:
            raise CommandError("--scrape and --beside-prune are two benches: give one")
        if o["night"]:
            raise CommandError(f"{flag} applies without --night")
        given = {name for name in (*SWEEP_ONLY, *NIGHT_ONLY, *FLEET_ONLY, "prune_runs") if o[name] is not None}
        wrong = sorted(given - set(MODES[mode]))
        if wrong:
            raise CommandError(f"--{wrong[0].replace('_', '-')} does not apply to {flag}")
        fields = {name: o[name] for name in MODES[mode] if o[name] is not None}
        progress = Progress(self.stderr._out)
        try:
            if mode == "scrape":
                result = scrape.run(scrape.ScrapeOptions(**fields), progress)
            else:
                result = beside_prune.run(beside_prune.PruneOptions(**fields), progress)
        except BenchError as exc:
            raise CommandError(str(exc)) from None
        shown = scrape_table if mode == "scrape" else prune_table
        self.stdout.write(json_line(result) if o["json"] else shown(result))

    def sweep_options(self, o):
        given = {name: o[name] for name in (*SWEEP_ONLY, "repeats") if o[name] is not None}
        return measure.Options(**given)

    def night_options(self, o):
        names = {
            "samples": "samples",
            "night_runs": "runs",
            "night_steps": "steps",
            "creatures": "creatures",
            "long_steps": "long_steps",
            "shard_latency_ms": "latency_ms",
            "repeats": "repeats",
            "fleet": "fleet",
            "fleet_down": "fleet_down",
            "back_after_s": "back_after_s",
            "tick_every_s": "tick_every_s",
        }
        return night.NightOptions(**{field: o[name] for name, field in names.items() if o[name] is not None})
