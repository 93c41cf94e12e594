"""The bench itself: seed, sweep each way, check every row came back, and report.

Each repeat seeds a fresh work set for each way in turn (the real sweep, the plain-SQL
sweep, the row-at-a-time port, and with ``workers=2`` two sweepers side by side), so
every way starts from identical rows; figures are medians over the repeats.
"""

import select
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from cleanup.conf import claim_timeout_s, max_revert_attempts, setting

from . import plain_sql, row_at_a_time, seed
from .counted import Counted
from .module import Instant
from .processes import LineChild, child_env
from .scratch import BenchError, connect, ensure_database, machine, scratch_url

FINDER_REPEAT = 25
# The plain-SQL way calls a batch's groups this many at once: the engine's default.
PLAIN_SQL_CONCURRENCY = 8


class WorkSet:
    """The size of a bench's work set, from its ``runs``, ``steps`` and ``resources``."""

    @property
    def rows(self):
        return self.runs * self.steps * self.resources

    @property
    def groups(self):
        return self.runs * self.steps


@dataclass(frozen=True)
class Options(WorkSet):
    runs: int = 200
    steps: int = 5
    resources: int = 20
    history: int = 0
    workers: int = 1
    latency_ms: int = 0
    repeats: int = 3


class Worker(LineChild):
    """A sweeper process (`eventsite.bench.worker`) that answers one JSON line per command."""

    def __init__(self, url, latency_ms):
        argv = [sys.executable, "-m", "eventsite.bench.worker", "--latency-ms", str(latency_ms)]
        super().__init__("the sweeper process", argv, child_env(url))

    def close(self):
        self.stop()


def collect(workers, poll):
    """Every worker's answer to the command just sent, calling ``poll`` while waiting."""
    answers, pending = {}, {w.proc.stdout.fileno(): w for w in workers}
    while pending:
        ready, _, _ = select.select(list(pending), [], [], 0.25)
        for fd in ready:
            answers[fd] = pending.pop(fd).read()
        poll()
    return list(answers.values())


class Bench:
    def __init__(self, options, progress):
        self.o = options
        self.progress = progress
        self.url = scratch_url()
        self.after = 0  # runs up to this id are history, never touched by a way
        self.analyzed = False
        self.figures = {
            "sweep": [],
            "statements": [],
            "rss": [],
            "plain_sql": [],
            "plain_statements": [],
            "row_at_a_time": [],
            "row_statements": [],
            "workers2": [],
        }
        self.reverted = {}  # way: the fewest rows it gave back in any repeat

    def run(self):
        ensure_database(self.url)
        self.progress.phase("migrating the scratch database")
        migrator = Worker(self.url, 0)
        migrator.ask(do="migrate")
        migrator.close()
        with connect(self.url) as conn:
            self.conn = conn
            sweepers = [Worker(self.url, self.o.latency_ms) for _ in range(self.o.workers)]
            try:
                finder = self.time_finder(sweepers[0])
                for repeat in range(1, self.o.repeats + 1):
                    self.repeat(repeat, sweepers)
            finally:
                for sweeper in sweepers:
                    sweeper.close()
            self.progress.close()
            return self.report(finder, machine(conn))

    def reseed(self, label):
        self.progress.phase(f"{label}: seeding")
        made = seed.reseed_work(
            self.conn,
            self.after,
            self.o.runs,
            self.o.steps,
            self.o.resources,
            analyze=not self.after or not self.analyzed,
        )
        self.analyzed = True
        self.progress.phase(label, self.o.rows)
        return made

    def time_finder(self, sweeper):
        seed.wipe(self.conn)
        self.reseed("finder, no history")
        no_history = sweeper.ask(do="finder", repeat=FINDER_REPEAT)
        with_history = {"ms": None}
        if self.o.history:
            seed.wipe(self.conn)
            self.progress.phase(f"seeding {self.o.history:,} resolved rows of history")
            self.after = seed.seed_history(self.conn, self.o.history)
            self.analyzed = False
            self.reseed("finder, with history")
            with_history = sweeper.ask(do="finder", repeat=FINDER_REPEAT)
        return {"name": no_history["finder"], "no_history": no_history["ms"], "with_history": with_history["ms"]}

    def repeat(self, n, sweepers):
        of = f"{n}/{self.o.repeats}"
        self.sweep(f"sweep {of}", sweepers[:1])
        self.plain_sql(f"plain SQL {of}")
        self.row_at_a_time(f"row at a time {of}")
        if len(sweepers) > 1:
            self.sweep(f"2 sweepers {of}", sweepers)

    def sweep(self, label, sweepers):
        self.reseed(label)
        for sweeper in sweepers:
            sweeper.send(do="sweep", after=self.after)
        started = _now()
        answers = collect(sweepers, self.poll)
        seconds = _now() - started
        self.check("sweep" if len(sweepers) == 1 else "workers", label, calls=sum(a["calls"] for a in answers))
        if len(sweepers) > 1:
            self.figures["workers2"].append(self.o.rows / seconds)
            return
        self.figures["sweep"].append(self.o.rows / seconds)
        self.figures["statements"].append(answers[0]["statements"] / self.o.groups)
        self.figures["rss"].append(answers[0]["peak_rss_mb"])

    def plain_sql(self, label):
        self.reseed(label)
        conn, action = Counted(self.conn), Instant(self.o.latency_ms)
        seconds, _, _ = plain_sql.sweep(
            conn,
            action,
            batch=setting("EVENT_CLEANUP_RUN_BATCH"),
            concurrency=PLAIN_SQL_CONCURRENCY,
            max_attempts=max_revert_attempts(),
            timeout_s=claim_timeout_s(),
            backoff_s=setting("EVENT_REVERT_BACKOFF_S"),
            progress=self.progress.advance,
        )
        self.check("plain_sql", label, calls=action.calls, exact_calls=True)
        self.figures["plain_sql"].append(self.o.rows / seconds)
        self.figures["plain_statements"].append(conn.statements / self.o.groups)

    def row_at_a_time(self, label):
        self.reseed(label)
        conn, action = Counted(self.conn), Instant(self.o.latency_ms)
        seconds, _ = row_at_a_time.sweep(
            conn,
            action,
            batch=setting("EVENT_CLEANUP_RUN_BATCH"),
            groups_per_run=setting("EVENT_CLEANUP_GROUPS_PER_RUN"),
            max_attempts=max_revert_attempts(),
            progress=self.progress.advance,
        )
        self.check("row_at_a_time", label, calls=action.calls, exact_calls=True)
        self.figures["row_at_a_time"].append(self.o.rows / seconds)
        self.figures["row_statements"].append(conn.statements / self.o.groups)

    def poll(self):
        if self.progress.enabled:
            self.progress.update(seed.count_rows(self.conn, self.after, ["reverted"]))

    def check(self, way, label, calls, exact_calls=False):
        """Every way must really give back every row, through one call per group."""
        reverted = seed.count_rows(self.conn, self.after, ["reverted"])
        self.reverted[way] = min(reverted, self.reverted.get(way, reverted))
        if reverted != self.o.rows:
            raise BenchError(f"{label} gave back {reverted:,} of {self.o.rows:,} rows")
        if calls < self.o.groups or (exact_calls and calls != self.o.groups):
            raise BenchError(f"{label} called the module {calls:,} times for {self.o.groups:,} groups")

    def report(self, finder, machine_info):
        f = {name: statistics.median(values) if values else None for name, values in self.figures.items()}
        result = {
            "rows": self.o.rows,
            "groups": self.o.groups,
            "sweep": {
                "rows_per_s": _r(f["sweep"]),
                "queries_per_group": _r(f["statements"], 2),
                "peak_rss_mb": _r(max(self.figures["rss"])),
                "reverted": self.reverted["sweep"],
            },
            "plain_sql": {
                "rows_per_s": _r(f["plain_sql"]),
                "queries_per_group": _r(f["plain_statements"], 2),
                "reverted": self.reverted["plain_sql"],
            },
            "row_at_a_time": {
                "rows_per_s": _r(f["row_at_a_time"]),
                "queries_per_group": _r(f["row_statements"], 2),
                "reverted": self.reverted["row_at_a_time"],
            },
            "ratio_to_plain_sql": _r(f["sweep"] / f["plain_sql"], 3),
            "ratio_to_row_at_a_time": _r(f["sweep"] / f["row_at_a_time"], 3),
            "finder_ms": {"no_history": _r(finder["no_history"], 3), "with_history": _r(finder["with_history"], 3)},
            "finder": finder["name"],
        }
        if self.o.workers > 1:
            result["workers"] = {"1": _r(f["sweep"]), "2": _r(f["workers2"])}
        result["options"] = asdict(self.o)
        result["machine"] = machine_info
        return result


def _r(value, digits=1):
    return None if value is None else round(value, digits)


def _now():
    return time.perf_counter()


def run(options, progress):
    return Bench(options, progress).run()
