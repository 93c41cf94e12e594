"""``manage.py bench --scrape``: what a ``/metrics`` scrape costs, metric by metric, without
history and beside a big one.

Each side is the state a bad night leaves (`worker.bad_night`): a work set given back by
the real sweep (so the counters and the histogram of calls hold what a night counts), a
second work set still live, the bench's backend marked down, the first step of each of
its runs failed past the attempts' ceiling (rows waiting for a person), an alert not yet
delivered. Then a sweeper process on the scratch database scrapes ``repeats`` times with
the collector ``/metrics`` serves (`cleanup.metrics.Collector`), timing each metric family
from the end of the one before it, with the statements it sent; and the whole answer as
the view makes it (counters flushed, the text rendered). The same again after
``history`` resolved rows in runs that ended a day ago, with their attempts and log.
Figures are medians.
"""

import statistics
import time
from dataclasses import asdict, dataclass

from . import seed
from .measure import Worker
from .scratch import connect, ensure_database, machine, scratch_url


@dataclass(frozen=True)
class ScrapeOptions:
    history: int = 1_000_000
    runs: int = 10
    steps: int = 5
    resources: int = 20
    repeats: int = 30


def time_scrape(repeat):
    """In the sweeper process: medians of each metric family's time and statements, and of a whole answer."""
    from django.db import connection
    from prometheus_client import CollectorRegistry, generate_latest

    from cleanup import counters
    from cleanup.conf import setting
    from cleanup.metrics import Collector

    collector = Collector(setting("EVENT_METRICS_NAMESPACE"))
    statements = 0

    def count(execute, sql, params, many, context):
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    per_metric, whole, text = {}, [], b""
    counters.flush()
    for n in range(repeat + 1):  # the first scrape warms the connection up and is not counted
        with connection.execute_wrapper(count):
            mark = time.perf_counter()
            sent = statements
            for family in collector.collect():
                now = time.perf_counter()
                if n:
                    figures = per_metric.setdefault(family.name, {"ms": [], "statements": [], "series": 0})
                    figures["ms"].append((now - mark) * 1000)
                    figures["statements"].append(statements - sent)
                    figures["series"] = len(family.samples)
                sent, mark = statements, time.perf_counter()
        started = time.perf_counter()
        counters.flush()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        text = generate_latest(registry)
        if n:
            whole.append((time.perf_counter() - started) * 1000)
    return {
        "metrics": {
            name: {
                "ms": statistics.median(f["ms"]),
                "max_ms": max(f["ms"]),
                "statements": max(f["statements"]),
                "samples": f["series"],
            }
            for name, f in per_metric.items()
        },
        "scrape_ms": statistics.median(whole),
        "bytes": len(text),
    }


class ScrapeBench:
    def __init__(self, options, progress):
        self.o = options
        self.progress = progress
        self.url = scratch_url()

    def run(self):
        ensure_database(self.url)
        self.progress.phase("migrating the scratch database")
        worker = Worker(self.url, 0)
        try:
            worker.ask(do="migrate")
            with connect(self.url) as conn:
                seed.wipe(conn, modules=True)
                without = self.night_and_scrape(conn, worker, after=0, label="no history")
                beside = None
                if self.o.history:
                    seed.wipe(conn, modules=True)
                    self.progress.phase(f"seeding {self.o.history:,} resolved rows of history")
                    after = seed.seed_history(conn, self.o.history, ended_days_ago=1, traces=True)
                    beside = self.night_and_scrape(conn, worker, after=after, label="with history")
                self.progress.close()
                return self.report(without, beside, machine(conn))
        finally:
            worker.close()

    def night_and_scrape(self, conn, worker, after, label):
        o = self.o
        self.progress.phase(f"{label}: a night given back by the sweep")
        seed.reseed_work(conn, after, o.runs, o.steps, o.resources)
        worker.ask(do="sweep", after=after)
        live_after = seed.last_run_id(conn)
        seed.seed_work(conn, o.runs, o.steps, o.resources)
        night = worker.ask(do="night", after=live_after)
        seed.vacuum_analyze(conn)
        self.progress.phase(f"{label}: {o.repeats} scrapes")
        figures = worker.ask(do="scrape", repeat=o.repeats)
        figures["night"] = {
            "given_back": seed.count_rows(conn, after, ["reverted"]),
            "live": seed.count_rows(conn, live_after, ["live"]),
            "failed": night["failed"],
        }
        return figures

    def report(self, without, beside, machine_info):
        metrics = {}
        for name, figures in without["metrics"].items():
            with_history = (beside or {}).get("metrics", {}).get(name, {})
            metrics[name] = {
                "no_history_ms": _r(figures["ms"]),
                "with_history_ms": _r(with_history.get("ms")),
                "with_history_max_ms": _r(with_history.get("max_ms")),
                "statements": max(figures["statements"], with_history.get("statements", 0)),
                "samples": with_history.get("samples", figures["samples"]),
            }
        return {
            "mode": "scrape",
            "history": self.o.history,
            "metrics": metrics,
            "scrape_ms": {"no_history": _r(without["scrape_ms"]), "with_history": _r((beside or {}).get("scrape_ms"))},
            "bytes": (beside or without)["bytes"],
            "night": (beside or without)["night"],
            "options": asdict(self.o),
            "machine": machine_info,
        }


def _r(value, digits=3):
    return None if value is None else round(value, digits)


def run(options, progress):
    return ScrapeBench(options, progress).run()
