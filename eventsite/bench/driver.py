"""The night's driver process: ``python -m eventsite.bench.driver``.

It starts, performs and ends runs through the runner, as the API and the commands do,
and reads what the cluster did from the database. DATABASE_URL names the scratch
database, SANDBOX_SHARD_URL the bench's shard, and its settings are the cluster's, so
what it queues goes to the cluster. It answers one JSON line per command read from
stdin (`COMMANDS`). Times it answers come from the rows the engine wrote (a run's
``ended_at``, its ``cleanup.swept`` entries' ``at``, its rows' ``resolved_at``), not from
when the driver happened to look.
"""

import json
import statistics
import sys
import time
from collections import Counter

PERFORM_TIMEOUT_S = 600
QUIET_S = 0.3
LOOK_EVERY_S = 0.02
TASK_SAVED_WAIT_S = 2.0


def now():
    """The task the cluster runs for `ping`: when it started, on this machine's clock."""
    return time.time()


def wipe():
    """Empty every table of the app and django-q2's queue and results, in one statement."""
    from django.apps import apps
    from django.db import connection
    from django_q.models import OrmQ, Task

    models = [*apps.get_app_config("cleanup").get_models(), OrmQ, Task]
    tables = ", ".join(connection.ops.quote_name(m._meta.db_table) for m in models)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    return {}


def ping(timeout_s=60):
    """Milliseconds from queueing a task to a worker starting it: the queue's own hop."""
    from django_q.tasks import async_task, result

    sent = time.time()
    started = result(async_task("eventsite.bench.driver.now", task_name="bench ping"), wait=int(timeout_s * 1000))
    if started is None:
        return {"error": f"the cluster did not run a queued task within {timeout_s} s"}
    return {"ms": (started - sent) * 1000}


def settle(timeout_s=120):
    """Wait until nothing is queued or in flight for `QUIET_S`: the cluster is idle."""
    from django_q.brokers import get_broker

    broker = get_broker()
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        if broker.queue_size() or broker.lock_size():
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S:
            return {"broker": type(broker).__name__}
        time.sleep(LOOK_EVERY_S)
    return {"error": f"the cluster was still busy after {timeout_s} s"}


def start(label, runs, steps, creatures, shards=None):
    """Start ``runs`` runs of ``steps`` spawns of ``creatures`` then a long wait, and
    perform their spawns; answers their ids. The cluster's ticks may perform some.

    With ``shards`` (names of SANDBOX_SHARDS) each spawn names a shard, in turn over the
    night's spawns: step ``j`` of run ``n`` goes to shard ``(n * steps + j) % len(shards)``,
    so every run holds rows on every shard (when it has as many steps)."""
    from cleanup.runner import start_run

    params = {"creature": "orc", "count": creatures, "at": "night-gate"}
    hold = {"action": "core.wait", "params": {"seconds": 3600}}

    def spawn(n, j):
        shard = {"shard": shards[(n * steps + j) % len(shards)]} if shards else {}
        return {"action": "sandbox.spawn", "params": {**params, **shard}}

    ids = [
        # Past the quotas on purpose: the bench measures the engine at any size.
        start_run(f"{label} {n + 1}", [spawn(n, j) for j in range(steps)] + [hold], actor="bench", quota=False).pk
        for n in range(runs)
    ]
    return perform(ids) or {"run_ids": ids}


def perform(ids):
    """Advance the runs until every spawn is done; an error when one cannot be."""
    from cleanup.models import Run, RunStatus, Step, StepStatus
    from cleanup.runner import WAIT, advance_run

    pending, deadline = set(ids), time.monotonic() + PERFORM_TIMEOUT_S
    while pending:
        for run_id in sorted(pending):
            advance_run(run_id)  # None when a cluster's tick holds the run: it performs then
        spawns = Step.objects.filter(run_id__in=pending).exclude(action_id=WAIT)
        pending = set(spawns.exclude(status=StepStatus.DONE).values_list("run_id", flat=True))
        ended = Run.objects.filter(pk__in=ids).exclude(status=RunStatus.RUNNING).first()
        if ended is not None:
            failed = Step.objects.filter(run=ended, status=StepStatus.FAILED).first()
            return {"error": f"run {ended.pk} {ended.status} while performing: {failed and failed.last_error}"}
        if time.monotonic() > deadline:
            return {"error": f"{len(pending)} run(s) were not performed within {PERFORM_TIMEOUT_S} s"}
        if pending:
            time.sleep(LOOK_EVERY_S)
    return None


def end(run_ids):
    """Cancel the runs one after another, as fast as the runner goes; each queues its cleanup."""
    from cleanup.runner import cancel_run

    for run_id in run_ids:
        cancel_run(run_id, actor="bench")
    return {}


def cleaned(run_ids, timeout_s):
    """Wait until every run's cleanup is complete; answers what the rows say about it."""
    from cleanup.models import CleanupStatus, Run

    runs = Run.objects.filter(pk__in=run_ids)
    deadline = time.monotonic() + timeout_s
    while runs.exclude(cleanup_status=CleanupStatus.COMPLETE).exists():
        stuck = runs.exclude(cleanup_status__in=(CleanupStatus.COMPLETE, CleanupStatus.PENDING)).first()
        if stuck is not None:
            return {"error": f"run {stuck.pk}'s cleanup ended {stuck.cleanup_status}"}
        if time.monotonic() > deadline:
            left = runs.exclude(cleanup_status=CleanupStatus.COMPLETE).count()
            return {"error": f"{left} run(s) were not cleaned within {timeout_s} s of their end"}
        time.sleep(LOOK_EVERY_S)
    return figures(run_ids)


def figures(run_ids):
    """When the runs ended and when their last row was given back, from the rows themselves."""
    from django.db.models import Max

    from cleanup.models import STEP_KIND, Resource, Run, RunLog

    ended_at = dict(Run.objects.filter(pk__in=run_ids).values_list("id", "ended_at"))
    ended = max(ended_at.values())
    passes = RunLog.objects.filter(run_id__in=run_ids, kind="cleanup.swept")
    rows = Resource.objects.filter(run_id__in=run_ids)
    given_back = max(
        at
        for at in (passes.aggregate(at=Max("at"))["at"], rows.aggregate(at=Max("resolved_at"))["at"])
        if at is not None
    )
    creatures = Counter(rows.exclude(kind=STEP_KIND).values_list("state", flat=True))
    return {
        "seconds": (given_back - ended).total_seconds(),
        "ended_at": ended.isoformat(),
        "rows": dict(creatures),
        "placeholders": dict(Counter(rows.filter(kind=STEP_KIND).values_list("state", flat=True))),
        "passes": dict(Counter(detail.get("by") for detail in passes.values_list("detail", flat=True))),
        "queued_ms": _queued_ms(ended_at),
    }


def _queued_ms(ended_at):
    """Median milliseconds from a run's end to its first cleanup task being queued
    (django-q2's ``started`` is when a task was queued), once the cluster saved them."""
    from django.db.models import Min
    from django_q.models import Task

    names = {f"cleanup run {run_id}": at for run_id, at in ended_at.items()}
    tasks = Task.objects.filter(name__in=names).values("name").annotate(queued=Min("started")).order_by()
    deadline = time.monotonic() + TASK_SAVED_WAIT_S
    while time.monotonic() < deadline:
        queued = {t["name"]: t["queued"] for t in tasks}
        if len(queued) == len(names):
            return statistics.median((at - names[name]).total_seconds() * 1000 for name, at in queued.items())
        time.sleep(LOOK_EVERY_S)
    return None  # a task the cluster has not saved yet, or a run the schedule's tick cleaned


def _ticking(tick_every_s):
    """A function to call while waiting: it queues a tick every ``tick_every_s`` seconds
    (none when 0, and the schedule's tick, once a minute, is all there is)."""
    from cleanup.enqueue import queue_tick

    last = {"at": None}

    def tick():
        at = time.monotonic()
        if tick_every_s and (last["at"] is None or at - last["at"] >= tick_every_s):
            last["at"] = at
            queue_tick()

    return tick


def _epoch(at):
    return None if at is None else at.timestamp()


def given_back(run_ids, backends, timeout_s, tick_every_s=0):
    """Wait until every row of the runs on ``backends`` is resolved, queueing a tick every
    ``tick_every_s`` meanwhile; answers what those rows say (`backend_figures`)."""
    from cleanup.models import UNRESOLVED, Resource

    rows = Resource.objects.filter(run_id__in=run_ids, backend__in=backends)
    tick, deadline = _ticking(tick_every_s), time.monotonic() + timeout_s
    while rows.filter(state__in=UNRESOLVED).exists():
        if time.monotonic() > deadline:
            left = rows.filter(state__in=UNRESOLVED).count()
            return {"error": f"{left} row(s) on {', '.join(backends)} were not resolved within {timeout_s} s"}
        tick()
        time.sleep(LOOK_EVERY_S)
    return backend_figures(run_ids, backends)


def backend_figures(run_ids, backends):
    """The runs' rows on ``backends``: their states, their attempts and their last verdict.

    ``spent`` counts the attempts beyond the one call that gave each row back: a row given
    back by its first call has ``revert_attempts`` 1 and spent none."""
    from django.db.models import Max, Sum

    from cleanup.models import STEP_KIND, Attempt, Resource, Run

    rows = Resource.objects.filter(run_id__in=run_ids, backend__in=backends)
    creatures = rows.exclude(kind=STEP_KIND)
    got = rows.aggregate(last=Max("resolved_at"), attempts=Sum("revert_attempts"))
    n = rows.count()
    return {
        "rows": dict(Counter(creatures.values_list("state", flat=True))),
        "placeholders": dict(Counter(rows.filter(kind=STEP_KIND).values_list("state", flat=True))),
        "attempts": got["attempts"] or 0,
        "spent": (got["attempts"] or 0) - rows.filter(revert_attempts__gt=0).count() if n else 0,
        "outcomes": dict(Counter(Attempt.objects.filter(resource__in=rows).values_list("outcome", flat=True))),
        "last_verdict": _epoch(got["last"]),
        "last_end": _epoch(Run.objects.filter(pk__in=run_ids).aggregate(at=Max("ended_at"))["at"]),
    }


def boot_seen(module, backend, boot_id, timeout_s, tick_every_s=0):
    """Wait until the engine has seen ``boot_id`` for the backend (its watch asked its
    ``health()``), queueing a tick every ``tick_every_s`` meanwhile."""
    from cleanup.models import ModuleHealth

    seen = ModuleHealth.objects.filter(module=module, backend=backend, boot_id=boot_id)
    tick, deadline = _ticking(tick_every_s), time.monotonic() + timeout_s
    while not seen.exists():
        if time.monotonic() > deadline:
            return {"error": f"the engine did not see {module}/{backend}'s boot id within {timeout_s} s"}
        tick()
        time.sleep(LOOK_EVERY_S)
    return {}


def resurrected(run_ids, expected, timeout_s, tick_every_s=0):
    """Wait until ``expected`` rows of the runs were found again after a restart
    (``resurrected_from``) and all of them given back, queueing a tick every
    ``tick_every_s`` meanwhile; answers when the last was found and given back."""
    from django.db.models import Max

    from cleanup.models import STEP_KIND, UNRESOLVED, Resource, ResourceState

    rows = Resource.objects.filter(run_id__in=run_ids, resurrected_from__isnull=False).exclude(kind=STEP_KIND)
    tick, deadline = _ticking(tick_every_s), time.monotonic() + timeout_s
    while rows.count() < expected or rows.filter(state__in=UNRESOLVED).exists():
        if time.monotonic() > deadline:
            found, left = rows.count(), rows.filter(state__in=UNRESOLVED).count()
            return {"error": f"{found} of {expected} resurrected row(s) found, {left} not given back, in {timeout_s} s"}
        tick()
        time.sleep(LOOK_EVERY_S)
    got = rows.aggregate(found=Max("created_at"), given_back=Max("resolved_at"))
    return {
        "found": rows.count(),
        "reverted": rows.filter(state=ResourceState.REVERTED).count(),
        "last_found": _epoch(got["found"]),
        "last_verdict": _epoch(got["given_back"]),
    }


def wake_tasks(since, until):
    """The engine's wake tasks that held a cluster worker between ``since`` and ``until``
    (epoch seconds): each one sleeps in its worker until its time (`cleanup.wakeup`), so
    while it does the passes have one worker fewer. Seconds from ``since`` to when each was
    queued (django-q2's ``started``) and to when it was done, of the tasks the cluster has
    saved (a task still sleeping is not among them)."""
    from datetime import UTC, datetime

    from django_q.models import Task

    start, end = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC)
    tasks = Task.objects.filter(name__startswith="wake at", started__lte=end, stopped__gte=start).order_by("started")
    return {
        "tasks": [
            {"queued_s": round(t.started.timestamp() - since, 3), "done_s": round(t.stopped.timestamp() - since, 3)}
            for t in tasks
        ]
    }


COMMANDS = {
    "migrate": lambda c: _migrate(),
    "wipe": lambda c: wipe(),
    "ping": lambda c: ping(),
    "settle": lambda c: settle(),
    "start": lambda c: start(c["label"], c["runs"], c["steps"], c["creatures"], c.get("shards")),
    "end": lambda c: end(c["run_ids"]),
    "cleaned": lambda c: cleaned(c["run_ids"], c["timeout_s"]),
    "given_back": lambda c: given_back(c["run_ids"], c["backends"], c["timeout_s"], c.get("tick_every_s", 0)),
    "backend_figures": lambda c: backend_figures(c["run_ids"], c["backends"]),
    "wake_tasks": lambda c: wake_tasks(c["since"], c["until"]),
    "boot_seen": lambda c: boot_seen(c["module"], c["backend"], c["boot_id"], c["timeout_s"], c.get("tick_every_s", 0)),
    "resurrected": lambda c: resurrected(c["run_ids"], c["expected"], c["timeout_s"], c.get("tick_every_s", 0)),
}


def _migrate():
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return {}


def main():
    import django

    django.setup()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            answer = COMMANDS[command["do"]](command)
        except Exception as exc:  # said to the bench, which stops and shows it
            answer = {"error": f"{command['do']}: {type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
