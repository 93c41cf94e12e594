"""`manage.py bench --night --fleet N [--fleet-down K]`: a fleet night, through the real system.

It starts ``N`` sandbox shards on free ports (``s01``, ``s02``, …), all at once, names them
in ``SANDBOX_SHARDS`` for the cluster and the driver, and, ``repeats`` times:

- **the same night with no shard down**: ``runs`` runs of ``steps`` spawns of ``creatures``,
  each spawn on a shard in turn over the night (step ``j`` of run ``n`` on shard
  ``(n * steps + j) % N``, so every run holds rows on every shard), are performed with the
  shards answering at once; then every shard answers after ``latency_ms`` and the runs
  end together. Seconds from the last end to the last verdict of the rows on the healthy
  shards (all but the last ``fleet_down``);
- **the night with shards down**: the same, but the last ``fleet_down`` shards are down
  (their ``down`` fault, ``refuse``: connections reset, as from a dead process) from after
  the spawns until ``back_after_s`` seconds after the last end, when they all come back.
  The same figure for the healthy shards; the attempts the down shards' rows spent
  (beyond the call that gave each back); and the seconds from their return to their last
  row given back;
- **the idle restart**: one run of ``RESTART_STEPS`` spawns on the first shard, which
  saves its world after the spawns; the run ends and is given back; once the engine has
  seen that shard's boot id (its watch), the shard restarts with a rollback, which brings
  back what the save held, while no run is active. Seconds from the restart until the
  resurrected rows are found (ledgered again) and given back.

A down backend is probed only by a pass, and an idle backend is watched only at the tick:
with ``tick_every_s`` the driver queues a tick task that often while it waits for the
return and the restart to be noticed (0: it queues none and the schedule's tick, once a
minute, is all there is). ``EVENT_OUTAGE_PROBE_S`` is `PROBE_S` for the cluster, and with
ticks queued ``EVENT_BACKEND_WATCH_S`` is its lowest bound (`WATCH_S`); the JSON says
which values were in force. Every row must be reverted and every creature gone from
every shard, or the bench stops.
"""

import os
import statistics
import time
from dataclasses import asdict

from cleanup.conf import setting

from .night import CLEAN_TIMEOUT_S, Night, _r
from .processes import Shard
from .scratch import BenchError, connect, ensure_database, machine

MODULE = "sandbox"
RESTART_STEPS = 10
# The bench's engine settings (read by the cluster and the driver from the environment).
PROBE_S = 2
WATCH_S = 10  # EVENT_BACKEND_WATCH_S's lowest bound: used when the driver queues ticks
TARGET_RATIO = 1.2
TARGET_BACK_S = 5  # beyond EVENT_OUTAGE_SPREAD_S
TARGET_RESTART_S = 10  # beyond EVENT_BACKEND_WATCH_S


class FleetNight(Night):
    def run(self):
        ensure_database(self.url)
        load_at_start = [round(x, 2) for x in os.getloadavg()]
        figures = {"base": [], "outage": [], "restart": []}
        try:
            self.start_children()
            for n in range(1, self.o.repeats + 1):
                figures["base"].append(self.night(f"fleet night {n}", down=None))
                figures["outage"].append(self.night(f"fleet night down {n}", down=self.down_names))
                figures["restart"].append(self.idle_restart(f"idle restart {n}"))
            self.shards_rss_mb_end = [rss_mb(s.proc.pid) for s in self.shards]
        finally:
            for child in reversed(self.children):
                child.stop()
            self.progress.close()
        with connect(self.url) as conn:
            result = {"machine": {**machine(conn), "load_average_at_start": load_at_start}}
        result["fleet"] = self.report(figures)
        result["options"] = asdict(self.o)
        return {"mode": "fleet-night", **self.queue, **result}

    def start_children(self):
        width = len(str(self.o.fleet))
        self.progress.phase(f"starting {self.o.fleet} shards")
        started = time.monotonic()
        self.shards = Shard.start_many([f"s{n:0{width}d}" for n in range(1, self.o.fleet + 1)], self.child)
        self.start_s = time.monotonic() - started
        self.shards_rss_mb = [rss_mb(s.proc.pid) for s in self.shards]
        self.names = [s.shard_name for s in self.shards]
        self.down_names = self.names[-self.o.fleet_down :]
        self.healthy = self.names[: -self.o.fleet_down]
        # One name, or the first and the last of the down ones (always the last shards).
        self.down = self.down_names[0] + (f"..{self.down_names[-1]}" if len(self.down_names) > 1 else "")
        self.progress.phase("starting the driver and the cluster")
        self.engine = {
            "EVENT_OUTAGE_PROBE_S": PROBE_S,
            "EVENT_OUTAGE_SPREAD_S": setting("EVENT_OUTAGE_SPREAD_S"),
            "EVENT_BACKEND_WATCH_S": WATCH_S if self.o.tick_every_s else setting("EVENT_BACKEND_WATCH_S"),
        }
        self.start_driver_and_cluster(
            SANDBOX_SHARDS=",".join(f"{s.shard_name}={s.url}" for s in self.shards),
            **self.engine,
        )

    def shard(self, name):
        return self.shards[self.names.index(name)]

    def all_faults(self, **faults):
        for shard in self.shards:
            shard.faults(**faults)

    def perform_on(self, label, runs, steps, shards):
        """Runs whose spawns are done and that now wait, with the cluster idle and the shards slow."""
        self.all_faults(latency_ms=0)
        ids = self.driver.ask(
            do="start", label=label, runs=runs, steps=steps, creatures=self.o.creatures, shards=shards
        )["run_ids"]
        self.all_faults(latency_ms=self.o.latency_ms)
        self.driver.ask(do="settle")
        self.cluster.check_alive()
        return ids

    def night(self, label, down):
        runs, steps = self.o.runs, self.o.steps
        rows = runs * steps * self.o.creatures
        self.progress.phase(f"{label}: performing {runs * steps:,} spawns on {len(self.names)} shards")
        ids = self.perform_on(label, runs, steps, self.names)
        for name in down or ():
            self.shard(name).faults(down="refuse")
        self.progress.phase(f"{label}: giving back {rows:,} rows" + (f", {self.down} down" if down else ""))
        self.driver.ask(do="end", run_ids=ids)
        healthy = self.driver.ask(do="given_back", run_ids=ids, backends=self.healthy, timeout_s=CLEAN_TIMEOUT_S)
        got = {"healthy_s": healthy["last_verdict"] - healthy["last_end"], "healthy": healthy}
        if down:
            got["while_down"] = self.driver.ask(do="backend_figures", run_ids=ids, backends=down)
            back_at = healthy["last_end"] + self.o.back_after_s
            self.progress.phase(f"{label}: {self.down} back {self.o.back_after_s} s after the last end")
            time.sleep(max(0.0, back_at - time.time()))
            for name in down:
                self.shard(name).faults(down=False)
            returned = time.time()
            self.progress.phase(f"{label}: {self.down} back; waiting for their rows")
            after = self.driver.ask(
                do="given_back",
                run_ids=ids,
                backends=down,
                timeout_s=CLEAN_TIMEOUT_S,
                tick_every_s=self.o.tick_every_s,
            )
            got.update(
                down=after, back_after_end_s=returned - healthy["last_end"], back_s=after["last_verdict"] - returned
            )
        self.check_clean(label, ids, steps * self.o.creatures)
        # Checked once the night is clean: a wake task is saved only once it is done.
        got["wake_tasks"] = self.driver.ask(do="wake_tasks", since=healthy["last_end"], until=healthy["last_verdict"])[
            "tasks"
        ]
        return got

    def idle_restart(self, label):
        shard = self.shards[0]
        steps = min(RESTART_STEPS, self.o.steps)
        self.progress.phase(f"{label}: {steps} spawns on {shard.shard_name}, saved, then given back")
        ids = self.perform_on(label, 1, steps, [shard.shard_name])
        shard.save()  # after the spawns, before the give-back: what the rollback brings back
        self.driver.ask(do="end", run_ids=ids)
        self.check_clean(label, ids, steps * self.o.creatures)
        self.progress.phase(f"{label}: waiting for the engine to see {shard.shard_name}'s boot id")
        self.driver.ask(
            do="boot_seen",
            module=MODULE,
            backend=shard.shard_name,
            boot_id=shard.boot_id(),
            timeout_s=CLEAN_TIMEOUT_S,
            tick_every_s=self.o.tick_every_s,
        )
        self.driver.ask(do="settle")
        shard.restart("rollback")
        restarted = time.time()
        back = len(shard.event_creatures())
        if back != steps * self.o.creatures:
            raise BenchError(
                f"the rollback of {shard.shard_name} brought back {back} creatures, not {steps * self.o.creatures}"
            )
        self.progress.phase(f"{label}: {shard.shard_name} restarted; waiting for its {back} creatures to be found")
        got = self.driver.ask(
            do="resurrected", run_ids=ids, expected=back, timeout_s=CLEAN_TIMEOUT_S, tick_every_s=self.o.tick_every_s
        )
        if left := shard.event_creatures():
            raise BenchError(
                f"{label}: the resurrected rows were given back but {len(left)} creature(s) are still there"
            )
        return {"rows": back, "found_s": got["last_found"] - restarted, "given_back_s": got["last_verdict"] - restarted}

    def check_clean(self, label, ids, rows_per_run):
        got = self.driver.ask(do="cleaned", run_ids=ids, timeout_s=CLEAN_TIMEOUT_S)
        expected = {"reverted": len(ids) * rows_per_run}
        if got["rows"] != expected or set(got["placeholders"]) - {"reverted"}:
            raise BenchError(
                f"{label}: runs {ids} ended clean but their rows say {got['rows']}, steps {got['placeholders']}"
            )
        for shard in self.shards:
            if left := shard.event_creatures():
                raise BenchError(
                    f"{label}: every row was given back but {len(left)} creature(s) are still on {shard.shard_name}"
                )

    def report(self, f):
        base = [x["healthy_s"] for x in f["base"]]
        outage = [x["healthy_s"] for x in f["outage"]]
        back = [x["back_s"] for x in f["outage"]]
        spent = [x["down"]["spent"] for x in f["outage"]]
        found = [x["found_s"] for x in f["restart"]]
        restart = [x["given_back_s"] for x in f["restart"]]
        last = f["outage"][-1]
        outage_s = statistics.median(outage)
        return {
            "shards": self.o.fleet,
            "down": self.down,
            "down_shards": self.down_names,
            "fleet_down": self.o.fleet_down,
            "start": {
                "seconds": _r(self.start_s, 2),
                "concurrently": True,
                "rss_mb_median": _mb_median(self.shards_rss_mb),
                "rss_mb_total": _mb_total(self.shards_rss_mb),
                "rss_mb_median_at_end": _mb_median(self.shards_rss_mb_end),
                "rss_mb_total_at_end": _mb_total(self.shards_rss_mb_end),
            },
            "spread": "each step on a shard in turn",
            "runs": self.o.runs,
            "groups": self.o.runs * self.o.steps,
            "rows": self.o.runs * self.o.steps * self.o.creatures,
            "healthy_rows": last["healthy"]["rows"].get("reverted", 0),
            "down_rows": last["down"]["rows"].get("reverted", 0),
            "engine": self.engine,
            "ticks": f"queued every {self.o.tick_every_s:g} s while waiting for the return and the restart"
            if self.o.tick_every_s
            else "the schedule's, once a minute",
            "healthy": {
                "seconds_no_shard_down": _r(statistics.median(base), 3),
                "all_no_shard_down": [_r(s, 3) for s in base],
                "seconds_down": _r(outage_s, 3),
                "all_down": [_r(s, 3) for s in outage],
                # The names of the time when one shard was all that went down, kept for readers of the JSON.
                "seconds_one_down": _r(outage_s, 3),
                "all_one_down": [_r(s, 3) for s in outage],
                "ratio": _r(outage_s / statistics.median(base), 3),
                "target_ratio": TARGET_RATIO,
                # Wake tasks sleeping in a cluster worker while the healthy rows were given back
                # (seconds from the last end to when each was queued and done), night by night.
                "wake_tasks_no_shard_down": [x["wake_tasks"] for x in f["base"]],
                "wake_tasks_down": [x["wake_tasks"] for x in f["outage"]],
            },
            "down_shard": {
                "attempts_spent": max(spent),
                "all_spent": spent,
                "attempts_while_down": [x["while_down"]["attempts"] for x in f["outage"]],
                "outcomes": last["down"]["outcomes"],
                "back_after_end_s": _r(statistics.median(x["back_after_end_s"] for x in f["outage"]), 3),
                "seconds_from_return": _r(statistics.median(back), 3),
                "all": [_r(s, 3) for s in back],
                "target_s": self.engine["EVENT_OUTAGE_SPREAD_S"] + TARGET_BACK_S,
            },
            "idle_restart": {
                "shard": self.names[0],
                "rows": f["restart"][-1]["rows"],
                "found_s": _r(statistics.median(found), 3),
                "all_found": [_r(s, 3) for s in found],
                "given_back_s": _r(statistics.median(restart), 3),
                "all": [_r(s, 3) for s in restart],
                "target_s": self.engine["EVENT_BACKEND_WATCH_S"] + TARGET_RESTART_S,
            },
        }


def rss_mb(pid):
    """The resident memory of process ``pid`` in MB (Linux's /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _mb_median(values):
    known = [v for v in values if v is not None]
    return _r(statistics.median(known)) if known else None


def _mb_total(values):
    known = [v for v in values if v is not None]
    return _r(sum(known)) if known else None


def run(options, progress):
    return FleetNight(options, progress).run()
