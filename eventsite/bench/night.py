"""`manage.py bench --night`: how soon runs that end are given back, through the real system.

On its scratch database (`scratch`) it starts a sandbox shard on a free port, ``manage.py qcluster``
as deployed (the ORM broker, or Redis when REDIS_URL is set) and a driver process
(`eventsite.bench.driver`) that starts, performs and ends runs through the runner. Runs
spawn their creatures with the shard answering at once; then the shard answers every
call after ``latency_ms`` and the runs are cancelled. It measures:

- **time to clean**: ``samples`` times, with the cluster idle, one run of one spawn of
  one creature ends; milliseconds from its ``ended_at`` to its last verdict;
- **the big night**: ``runs`` runs of ``steps`` spawns of ``creatures`` end together;
  seconds from the last end to the last verdict of them all;
- **one long run**: one run of ``long_steps`` spawns of ``creatures``, the same way.

Every creature must be gone from the shard and every row reverted, or the bench stops.
The children are stopped whatever happens, Ctrl-C included.
"""

import math
import os
import random
import secrets
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from django.conf import settings

from .processes import Cluster, LineChild, Shard, child_env
from .scratch import NIGHT_NAME, BenchError, connect, ensure_database, machine, scratch_url

CLEAN_TIMEOUT_S = 600


@dataclass(frozen=True)
class NightOptions:
    samples: int = 20
    runs: int = 10
    steps: int = 50
    creatures: int = 20
    long_steps: int = 500
    latency_ms: int = 20
    repeats: int = 3
    # The fleet night (`eventsite.bench.fleet_night`): shards, 0 for the night above.
    fleet: int = 0
    fleet_down: int = 1
    back_after_s: int = 30
    tick_every_s: float = 2.0


class Night:
    def __init__(self, options, progress):
        self.o = options
        self.progress = progress
        self.url = scratch_url(NIGHT_NAME)
        self.children = []

    def run(self):
        ensure_database(self.url)
        load_at_start = [round(x, 2) for x in os.getloadavg()]
        try:
            self.start_children()
            result = {
                "time_to_clean_ms": self.time_to_clean(),
                "night": self.repeated("big night", self.o.runs, self.o.steps),
                "long_run": self.repeated("long run", 1, self.o.long_steps),
            }
        finally:
            for child in reversed(self.children):
                child.stop()
            self.progress.close()
        with connect(self.url) as conn:
            result["machine"] = {**machine(conn), "load_average_at_start": load_at_start}
        result["options"] = asdict(self.o)
        return {"mode": "night", **self.queue, **result}

    def start_children(self):
        self.progress.phase("starting the shard, the driver and the cluster")
        self.shard = self.child(Shard())
        self.start_driver_and_cluster(SANDBOX_SHARD_URL=self.shard.url, SANDBOX_SHARDS="")

    def start_driver_and_cluster(self, **extra):
        """The driver and ``manage.py qcluster``, with one environment: ``extra`` on top."""
        env = child_env(
            self.url,
            settings_module="eventsite.settings",
            **extra,
            # One key for the driver and the cluster: it signs the tasks. One queue name of
            # the bench's own, so that no other cluster on the same Redis takes its tasks.
            SECRET_KEY=os.environ.get("SECRET_KEY") or "bench-only-" + secrets.token_hex(24),
            Q_NAME=f"eventsite-bench-{os.getpid()}",
        )
        self.driver = self.child(LineChild("the driver process", [sys.executable, "-m", "eventsite.bench.driver"], env))
        self.driver.ask(do="migrate")
        self.driver.ask(do="wipe")
        self.cluster = self.child(Cluster(env))
        self.driver.ask(do="ping")  # the cluster answers: its start-up work is queued before
        broker = self.driver.ask(do="settle")["broker"]
        conf = settings.Q_CLUSTER
        self.queue = {
            "broker": broker,
            "poll_s": conf.get("poll") if broker == "ORM" else None,
            "cluster_workers": conf.get("workers"),
        }

    def child(self, child):
        self.children.append(child)
        return child

    def time_to_clean(self):
        ms, queued, hops = [], [], []
        for n in range(1, self.o.samples + 1):
            self.progress.phase(f"time to clean {n}/{self.o.samples}")
            ids = self.perform(f"time to clean {n}", 1, 1, 1)
            hops.append(self.driver.ask(do="ping")["ms"])  # the queue's own hop, idle
            self.driver.ask(do="settle")
            # An idle ORM broker looks for work every `poll` seconds: the end must not fall
            # at the same moment of that cycle every time.
            time.sleep(random.uniform(0, 1))
            got = self.end_and_clean(ids, 1)
            ms.append(got["seconds"] * 1000)
            if got["queued_ms"] is not None:
                queued.append(got["queued_ms"])
        return {
            "median": _r(statistics.median(ms)),
            "p90": _r(p90(ms)),
            "samples": [_r(x) for x in ms],
            "queued_median": _r(_median(queued)),
            "queue_hop_median": _r(statistics.median(hops)),
        }

    def repeated(self, label, runs, steps):
        seconds, last = [], None
        for n in range(1, self.o.repeats + 1):
            self.progress.phase(f"{label} {n}/{self.o.repeats}: performing {runs * steps:,} spawns")
            ids = self.perform(f"{label} {n}", runs, steps, self.o.creatures)
            self.progress.phase(f"{label} {n}/{self.o.repeats}: giving back {runs * steps * self.o.creatures:,} rows")
            last = self.end_and_clean(ids, steps * self.o.creatures)
            seconds.append(last["seconds"])
        return {
            "runs": runs,
            "groups": runs * steps,
            "rows": runs * steps * self.o.creatures,
            "seconds": _r(statistics.median(seconds), 3),
            "all": [_r(s, 3) for s in seconds],
            "passes": last["passes"],
        }

    def perform(self, label, runs, steps, creatures):
        """Runs whose spawns are done and that now wait, with the cluster idle and the shard slow."""
        self.shard.faults(latency_ms=0)
        ids = self.driver.ask(do="start", label=label, runs=runs, steps=steps, creatures=creatures)["run_ids"]
        self.shard.faults(latency_ms=self.o.latency_ms)
        self.driver.ask(do="settle")
        self.cluster.check_alive()
        return ids

    def end_and_clean(self, ids, rows_per_run):
        self.driver.ask(do="end", run_ids=ids)
        got = self.driver.ask(do="cleaned", run_ids=ids, timeout_s=CLEAN_TIMEOUT_S)
        expected = {"reverted": len(ids) * rows_per_run}
        if got["rows"] != expected or set(got["placeholders"]) - {"reverted"}:
            raise BenchError(f"runs {ids} ended clean but their rows say {got['rows']}, steps {got['placeholders']}")
        if left := self.shard.event_creatures():
            raise BenchError(f"the runs' rows were given back but {len(left)} creature(s) are still on the shard")
        return got


def p90(values):
    """The nearest-rank 90th percentile: the smallest value at least 90% of them do not exceed."""
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def _median(values):
    return statistics.median(values) if values else None


def _r(value, digits=1):
    return None if value is None else round(value, digits)


def run(options, progress):
    return Night(options, progress).run()
