"""django-q2 entry points and the schedule.

Each task is a few lines over the engine. django-q2 may hand a task out twice (a worker
killed mid-task, an acknowledgement that came late), so none of these relies on running
once: the ledger's claims are what keep two workers off one row, and the one tick
schedule is ensured by name (rule 29).
May import: anything of the engine; nothing imports it but django-q2 (by dotted
path), the app config, and surfaces that queue work.
"""

import datetime as dt
import functools
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from django.db import DatabaseError, connection, transaction

from . import counters

# The queueing helpers live in `cleanup.enqueue`, which the engine uses too; the surfaces
# that queue work (the API, the admin) may keep importing them from here.
from .enqueue import (  # noqa: F401
    KEEPALIVE,
    TICK,
    queue_cleanup,
    queue_cleanups,
    queue_keepalive,
    queue_reconcile,
    queue_startup,
    queue_sweep,
    queue_tick,
)
from .logs import log_context

if TYPE_CHECKING:
    from django_q.models import Schedule

    from .models import Run

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)


def task(fn: Callable[P, R]) -> Callable[P, R]:
    """A django-q2 entry point: what it logs says which task it was (`cleanup.logs`), and
    what it counted is written for the metrics when it ends (`cleanup.counters`).

    A task that lost its database (a restart, a failover) ends with one line, not a
    traceback (rule 27): what it was doing is in the database, and the next tick or pass
    goes on with it; the outage is logged once (`cleanup.sweep.reconnect`)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with log_context(task=fn.__name__):
                return fn(*args, **kwargs)
        except DatabaseError as error:
            from .sweep import reconnect

            if not reconnect.lost(error):
                raise
            reconnect.note_lost(error, fn.__name__)
            connection.close()
            return cast(R, f"{fn.__name__}: the database was lost; the next tick or pass goes on")
        finally:
            counters.flush()  # what the task counted, for the metrics

    return run


SCHEDULE_NAME = "events: tick"
SCHEDULE_FUNC = TICK


@task
def tick_task() -> str:
    from .runner import tick

    record_clock()
    line: str = tick(by="tick task").line()
    notice_staff()
    return line


@task
def wake_task(at: str | dt.datetime | None = None) -> str:
    """The engine's wake-up (`cleanup.wakeup`): before ``at``, start its timer and return (no
    worker waits); at ``at``, tick, which arms the next."""
    from .wakeup import wake

    waiting = wake(at)
    return waiting if waiting is not None else tick_task()


@task
def sweep_task() -> str:
    from datetime import timedelta

    from django.utils import timezone

    from .conf import setting
    from .sweep import Ahead, sweep

    ahead = Ahead(queue_sweep)
    result = sweep(by="queue", deadline=timezone.now() + timedelta(seconds=setting("EVENT_TICK_BUDGET_S")), ahead=ahead)
    if result.work_left:
        ahead()
    else:
        wake_when_due()
    notice_staff()
    line: str = result.line()
    return line


@task
def cleanup_run_task(run_id: int, actor: str | None = None) -> str:
    from .models import Run

    run = Run.objects.filter(pk=run_id).first()
    if run is None or not run.is_terminal:
        return f"run {run_id} is not there or not ended; nothing to clean"
    with log_context(run=run_id):
        return _cleanup_run(run, actor)


def _cleanup_run(run: "Run", actor: str | None) -> str:
    from .sweep import Ahead, cleanup_run

    run_id = run.pk
    ahead = Ahead(lambda: queue_cleanup(run_id, actor=actor))
    summary = cleanup_run(run, by=actor or "queue", ahead=ahead)
    if summary.work_left:
        ahead()
    else:
        wake_when_due()  # a row's backoff ends on time, not at the minute tick
    notice_staff()
    return f"run {run_id}: attempted {summary.attempted}, remaining {summary.remaining}"


@task
def cleanup_runs_task(run_ids: list[int], actor: str | None = None) -> str:
    """Several runs a person retried at once: one pass each, a moment apart (`clean_in_turn`)."""
    from .manual import clean_in_turn

    done = clean_in_turn(run_ids, actor)
    notice_staff()
    return f"cleaned {done} run(s) in turn"


def wake_when_due() -> None:
    """Arm the engine's wake-up for the next work that falls due (`cleanup.wakeup`); never fails the task."""
    from .wakeup import arm_next

    try:
        arm_next()
    except Exception:
        logger.exception("could not arm the next wake-up; the minute tick is the backstop")


def record_clock(starting: bool = False) -> None:
    """Record how far this cluster's clock is from the database's (`cleanup.skew`), one
    statement; never fails the task. Decisions use the database's clock: this only shows it."""
    from .skew import WARN_S, record

    try:
        offset = record()
    except Exception:
        logger.warning("could not record this worker's clock offset", exc_info=True)
        return
    if starting and abs(offset) > WARN_S:
        logger.warning(
            "this worker's clock is %+.1f s off the database's: claims use the database's clock, "
            "so only the times in this worker's log lines are off; keep its clock in time with NTP",
            offset,
        )


def notice_staff() -> None:
    """Tell staff what changed (cleanup.alerts); never lets a mail or webhook fail the task."""
    from .alerts import notice

    try:
        notice()
    except Exception:
        logger.exception("could not send the cleanup alerts; the next tick tries again")


@task
def reconcile_task(module: str | None = None, restarted: bool = False, backend: str | None = None) -> dict[str, Any]:
    """A reconcile of one module (its summary's values), or of every module (each one's by name)."""
    from .reconcile import reconcile, reconcile_all

    if module is None:
        results = reconcile_all(restarted=restarted)
        return {name: vars(summary) for name, summary in results.items()}
    # As after a restart, it pays the backends' owed reconciles and queues the sweep for what came back.
    values: dict[str, Any] = vars(reconcile(module, restarted=restarted, backend=backend))
    return values


@task
def reconcile_owed_task(module: str, backend: str = "") -> str:
    """The reconcile a backend owes after a restart, sooner than the next tick; nothing
    when it is paid already or another worker is paying it (`cleanup.reconcile.pay_one`)."""
    from .models import ModuleHealth, backend_name
    from .reconcile import pay_one

    health = ModuleHealth.objects.filter(module=module, backend=backend, reconcile_owed_since__isnull=False).first()
    if health is None:
        return f"{backend_name(module, backend)} owes no reconcile"
    outcome = {True: "done", False: "still owed", None: "another worker has it"}[pay_one(health)]
    return f"owed reconcile of {health.name}: {outcome}"


PRUNE_SCHEDULE_NAME = "events: prune"
PRUNE_FUNC = "cleanup.tasks.prune_task"
KEEPALIVE_SCHEDULE_NAME = "events: keepalive"

# Each schedule the app keeps, by name: the tick every minute, the prune every hour, and the
# dead-man's switch's renewals every minute, apart from the tick so that a slow tick
# cannot starve them (rule 34).
SCHEDULES: dict[str, dict[str, Any]] = {
    SCHEDULE_NAME: {"func": SCHEDULE_FUNC, "schedule_type": "I", "minutes": 1, "repeats": -1},
    PRUNE_SCHEDULE_NAME: {"func": PRUNE_FUNC, "schedule_type": "H", "minutes": None, "repeats": -1},
    KEEPALIVE_SCHEDULE_NAME: {"func": KEEPALIVE, "schedule_type": "I", "minutes": 1, "repeats": -1},
}
# A renewal loop holds its worker at most this long before it queues the next (rule 34).
KEEPALIVE_LOOP_S = 40


@task
def keepalive_task(loop: str | None = None, chained: bool = False) -> str:
    """Renew the dead-man's switch sessions that are due (rule 34): a call per backend per
    third of ``EVENT_DEADMAN_TTL_S``, cheap. A ttl whose third is shorter than the minute
    schedule is kept by a loop that renews each session as it falls due, then queues itself
    with its ``loop`` token to go on; a run that finds another loop holding the sessions
    leaves them to it. (``chained`` is what tasks queued before the token said; unused.)"""
    from .deadman import needs_loop
    from .runner import keep_alive, keep_alive_loop
    from .wakeup import clock_runs

    renewals = keep_alive()
    line = f"renewed {sum(r.renewed for r in renewals)} session(s), {sum(r.lapsed for r in renewals)} lapsed"
    if not needs_loop() or not clock_runs():
        return line
    token = uuid.UUID(loop) if loop else uuid.uuid4()
    if keep_alive_loop(KEEPALIVE_LOOP_S, token=token):
        queue_keepalive(loop=str(token))
    return line


# The scheduled prune deletes at most this many batches a run: an hour's backlog of a
# busy site in one go, and a first prune of years of history spread over hours.
PRUNE_TASK_BATCHES = 20


@task
def prune_task() -> str:
    from .retention import prune
    from .skew import forget_old

    line: str = prune(max_batches=PRUNE_TASK_BATCHES).line()
    forget_old()  # the clock readings of clusters gone for a week
    return line


def ensure_schedule(**kwargs: Any) -> "Schedule":
    """Create or update the app's schedules, by name; running it again changes nothing.

    `Schedule.name` is not unique in django-q2, so two processes starting at once may
    both create one: whoever creates also removes every copy but the oldest, and both
    end with the same single row. Answers the tick's schedule.
    """
    ensured = {name: _ensure_one(name, fields) for name, fields in SCHEDULES.items()}
    return ensured[SCHEDULE_NAME]


def _ensure_one(name: str, fields: Mapping[str, Any]) -> "Schedule":
    from django_q.models import Schedule

    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(name=name).order_by("id").first()
        if schedule is None:
            Schedule.objects.create(name=name, **fields)
        else:
            changed = [k for k, v in fields.items() if getattr(schedule, k) != v]
            for k in changed:
                setattr(schedule, k, fields[k])
            if changed:
                schedule.save(update_fields=changed)
    oldest = Schedule.objects.filter(name=name).order_by("id").first()
    Schedule.objects.filter(name=name).exclude(pk=oldest.pk).delete()
    return oldest


@task
def startup_task() -> dict[str, Any]:
    """What a worker queues when it starts: the schedule, then the dead-man's switch
    sessions (first contact: what a backend gave back by itself is recorded as such before
    a reconcile could call it gone, rule 34), then a reconcile of every module."""
    from .runner import keep_alive

    ensure_schedule()
    keep_alive()
    return reconcile_task()


# The worker process that has queued its start-up work (its pid): once per process.
_started_in: int | None = None


def on_worker_start(sender: object = None, proc_name: str | None = None, **kwargs: Any) -> None:
    """A worker that starts ensures the schedule and asks every module what is in force (rule 10)."""
    global _started_in
    # django-q2's sync mode runs a worker inside the caller for every task, and says so as a
    # worker starting: in the caller (the main process), or in a cluster's worker running
    # its tasks inline (``Q_SYNC`` on). Reacting to those would queue the start-up work
    # inside itself without end; a worker process queues it once, when it really starts.
    if proc_name == "MainProcess" or _started_in == os.getpid():
        return
    _started_in = os.getpid()
    record_clock(starting=True)
    try:
        queue_startup()
    except Exception:
        logger.exception("could not queue the start-up work")
