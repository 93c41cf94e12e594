"""``manage.py bench --beside-prune``: the sweep's speed alone and beside a pruning run.

Every measurement starts from the same database: the ledger emptied, then ``prune_runs``
runs of 20 resolved rows that ended past the retention window, with the attempt that gave
each row back and the runs' log (what `cleanup.retention.prune` deletes), then a work set
of ``runs`` x ``steps`` x ``resources`` live rows of runs that just ended. The sweep gives
the work set back in a sweeper process of its own, either alone or while a second process
makes one pruning run as the scheduled task makes it (`tasks.PRUNE_TASK_BATCHES` batches of
``EVENT_PRUNE_BATCH`` runs), started together. The two are measured in turn, ``repeats``
times, the order swapped every repeat; figures are medians, and the JSON says how much of
each sweep a prune ran beside (``overlap``: 1.0 when the prune lasted the whole sweep).
"""

import statistics
from dataclasses import asdict, dataclass

from cleanup.conf import setting
from cleanup.tasks import PRUNE_TASK_BATCHES

from . import seed
from .measure import Worker, WorkSet, collect
from .scratch import BenchError, connect, ensure_database, machine, scratch_url


@dataclass(frozen=True)
class PruneOptions(WorkSet):
    runs: int = 200
    steps: int = 5
    resources: int = 20
    # Runs past the window: one scheduled pruning run's worth by default (set in `run`).
    prune_runs: int = 0
    repeats: int = 5


class BesidePrune:
    def __init__(self, options, progress):
        self.o = options
        self.progress = progress
        self.url = scratch_url()
        self.figures = {"alone": [], "beside": [], "prune_s": [], "overlap": [], "pruned": []}

    def run(self):
        ensure_database(self.url)
        self.progress.phase("migrating the scratch database")
        sweeper = Worker(self.url, 0)
        pruner = Worker(self.url, 0)
        try:
            sweeper.ask(do="migrate")
            with connect(self.url) as conn:
                self.conn = conn
                for n in range(1, self.o.repeats + 1):
                    order = ("alone", "beside") if n % 2 else ("beside", "alone")
                    for way in order:
                        self.measure(way, f"{way} {n}/{self.o.repeats}", sweeper, pruner)
                self.progress.close()
                return self.report(machine(conn))
        finally:
            sweeper.close()
            pruner.close()

    def prepare(self, label):
        """The same starting point for every measurement: old history past the window, a fresh work set."""
        self.progress.phase(f"{label}: seeding {self.o.prune_runs:,} runs past the retention window")
        seed.wipe(self.conn, modules=True)
        days = setting("EVENT_RETENTION_DAYS") + 30
        after = seed.seed_history(
            self.conn, self.o.prune_runs * seed.HISTORY_ROWS_PER_RUN, ended_days_ago=days, traces=True
        )
        seed.vacuum_analyze(self.conn)
        seed.reseed_work(self.conn, after, self.o.runs, self.o.steps, self.o.resources)
        return after

    def measure(self, way, label, sweeper, pruner):
        after = self.prepare(label)
        self.progress.phase(label, self.o.rows)
        if way == "beside":
            pruner.send(do="prune", max_batches=PRUNE_TASK_BATCHES)
        sweeper.send(do="sweep", after=after)
        (sweep,) = collect([sweeper], self.poll(after))
        if way == "beside":
            prune = pruner.read()
            self.figures["prune_s"].append(prune["seconds"])
            self.figures["pruned"].append(prune["runs"])
            overlap = min(sweep["t1"], prune["t1"]) - max(sweep["t0"], prune["t0"])
            self.figures["overlap"].append(max(0.0, overlap) / (sweep["t1"] - sweep["t0"]))
            if prune["runs"] != self.o.prune_runs:
                raise BenchError(f"{label}: the prune deleted {prune['runs']:,} of {self.o.prune_runs:,} old runs")
        reverted = seed.count_rows(self.conn, after, ["reverted"])
        if reverted != self.o.rows:
            raise BenchError(f"{label}: the sweep gave back {reverted:,} of {self.o.rows:,} rows")
        self.figures[way].append(self.o.rows / sweep["seconds"])

    def poll(self, after):
        def update():
            if self.progress.enabled:
                self.progress.update(seed.count_rows(self.conn, after, ["reverted"]))

        return update

    def report(self, machine_info):
        f = {name: statistics.median(values) for name, values in self.figures.items()}
        return {
            "mode": "beside-prune",
            "rows": self.o.rows,
            "groups": self.o.groups,
            "sweep": {
                "alone_rows_per_s": round(f["alone"], 1),
                "beside_prune_rows_per_s": round(f["beside"], 1),
                "alone": [round(x, 1) for x in self.figures["alone"]],
                "beside_prune": [round(x, 1) for x in self.figures["beside"]],
            },
            "ratio": round(f["beside"] / f["alone"], 3),
            "prune": {
                "runs": self.o.prune_runs,
                "rows": self.o.prune_runs * seed.HISTORY_ROWS_PER_RUN,
                "batches": PRUNE_TASK_BATCHES,
                "batch": setting("EVENT_PRUNE_BATCH"),
                "seconds": round(f["prune_s"], 2),
                "overlap": round(min(self.figures["overlap"]), 3),
            },
            "options": asdict(self.o),
            "machine": machine_info,
        }


def run(options, progress):
    if not options.prune_runs:
        options = PruneOptions(**{**asdict(options), "prune_runs": setting("EVENT_PRUNE_BATCH") * PRUNE_TASK_BATCHES})
    return BesidePrune(options, progress).run()
