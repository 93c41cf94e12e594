"""The engine's own clock: work due at a known time is looked at then, not at the next minute
(rule 32).

django-q2 has no delayed tasks, and its scheduler looks for due schedules only every 30 s,
so a ``core.wait(2)`` left to the minute tick ends up to a minute late, and a backend a
person marks up resumes its work at the next tick. Whenever the engine knows when work
falls due (a run's ``wake_at``: a wait, a step's backoff, a step held by a down backend;
a ledger row's ``next_attempt_at``: a backoff, a resume spread after a mark-up), it arms
a wake-up for that time:

- due within ``TIMER_MAX_S``: a wake task is queued now. It holds no worker while it
  waits: in the worker's process it starts a timer (a thread of that process) and returns
  at once; when the timer goes off, the wake task is queued again, now due, and ticks in
  whichever worker is free (`cleanup.tasks.wake_task`). A cluster's workers are thus
  always free for the passes, however many wake-ups are armed.
- due later: one django-q2 schedule, ``events: wake`` (run once), is set early enough that
  its 30 s scheduler queues the wake task before the time; the task sets its timer for the
  rest.

Many runs waiting at once hold one timer, not one each: the one `Wake` row says which time
a timer already waits for, and only an earlier time takes it over (a conditional UPDATE).
Every tick ends by arming the next wake-up from the data itself (`arm_next`), so a
wake-up that lost to an earlier one, or whose timer was lost with its process (a worker
recycled or killed), is armed again by the tick before it; the minute tick stays the
backstop. A wake-up made moot before its time (its rows forgiven, its run cancelled) costs
one short task when the timer goes off: the tick it would run is skipped when nothing is
due by then, and the next wake-up is armed instead.

In django-q2's sync mode (the tests) a queued task runs in the caller, so there is no
clock to wait on: nothing is armed.
May import: the models, conf, `clock`, `rows` and `enqueue`; imported by the runner, `outages` and the tasks.
"""

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import IntegrityError, connections, transaction
from django.db.models import Min, Q

from . import clock, rows
from .conf import WAKE_TIMER_MAX_S, max_revert_attempts
from .enqueue import WAKE, enqueue
from .models import Resource, Run, RunStatus, Wake

logger = logging.getLogger(__name__)

# The longest a wake task's timer waits before the task is queued again (a constant).
TIMER_MAX_S = WAKE_TIMER_MAX_S
# django-q2's scheduler looks for due schedules this often (its Sentinel's fixed cycle).
SCHEDULER_EVERY_S = 30
# A wake armed this long ago whose task never cleared it was lost: a later arm takes it over.
LOST_AFTER_S = 30
# A wake task this close to its time ticks at once rather than starting a timer.
DUE_WITHIN_S = 0.05
SCHEDULE_NAME = "events: wake"
WAKE_ROW = 1


def clock_runs() -> bool:
    """Is there a cluster to keep time in? Not in django-q2's sync mode, where a task runs in
    its caller (read from django-q2's configuration, which it reads once at import)."""
    from django_q.conf import Conf

    return not Conf.SYNC


def next_due(now: datetime | None = None) -> datetime | None:
    """The earliest time after ``now`` at which the engine has work: a running run's
    ``wake_at``, or a ledger row the sweep would claim once its ``next_attempt_at`` passes."""
    now = now or clock.now()
    run_at: datetime | None = Run.objects.filter(status=RunStatus.RUNNING, wake_at__gt=now).aggregate(
        at=Min("wake_at")
    )["at"]
    max_attempts = max_revert_attempts()
    row_at: datetime | None = Resource.objects.filter(
        rows.backing_off(now, max_attempts) & rows.in_automatic_sweep()
    ).aggregate(at=Min("next_attempt_at"))["at"]
    times = [at for at in (run_at, row_at) if at is not None]
    return min(times) if times else None


def due_by(at: datetime, now: datetime | None = None) -> bool:
    """Is any work due by ``at`` (or by now, when later)? A running run whose ``wake_at`` has
    come, or a ledger row the automatic sweep may claim. A wake-up for ``at`` whose work was
    made moot meanwhile (its rows forgiven or given back, its run cancelled) answers False."""
    now = now or clock.now()
    until = max(at, now)
    runs = Run.objects.filter(Q(wake_at__isnull=True) | Q(wake_at__lte=until), status=RunStatus.RUNNING)
    ledger = Resource.objects.filter(rows.claimable(until, max_revert_attempts()) & rows.in_automatic_sweep())
    return runs.exists() or ledger.exists()


def arm_next(now: datetime | None = None) -> datetime | None:
    """Arm the wake-up for the earliest work due after ``now`` (`next_due`); answers its time."""
    if not clock_runs():
        return None
    now = now or clock.now()
    at = next_due(now)
    if at is not None:
        arm(at, now)
    return at


def arm(at: datetime | None, now: datetime | None = None) -> str | None:
    """Make sure the engine wakes at ``at``; answers how: "queued", "scheduled", or None
    when a wake-up at or before it is already armed (or there is no clock)."""
    if at is None or not clock_runs():
        return None
    now = now or clock.now()
    if at - now > timedelta(seconds=TIMER_MAX_S):
        return "scheduled" if _schedule(at) else None
    if not _take(at, now):
        return None
    queue(at)
    return "queued"


def queue(at: datetime) -> None:
    """Queue the wake task for ``at``."""
    enqueue(WAKE, at=at.isoformat(), task_name=f"wake at {at.isoformat(timespec='seconds')}")


def _take(at: datetime, now: datetime) -> bool:
    """Take the `Wake` row for ``at`` when nothing earlier is armed; True for the winner."""
    free = Q(at__isnull=True) | Q(at__gt=at) | Q(at__lt=now - timedelta(seconds=LOST_AFTER_S))
    if Wake.objects.filter(free, pk=WAKE_ROW).update(at=at):
        return True
    try:
        with transaction.atomic():
            Wake.objects.create(pk=WAKE_ROW, at=at)
        return True
    except IntegrityError:
        return False  # it exists, and holds a wake-up at or before this one


def _schedule(at: datetime) -> bool:
    """Set the one ``events: wake`` schedule so that the scheduler queues a wake task before
    ``at``; an earlier one is left as it is (its tick arms the next). True when it changed."""
    from django_q.models import Schedule

    fire_at = at - timedelta(seconds=TIMER_MAX_S - 5)
    fields = {
        "func": WAKE,
        "kwargs": repr({"at": at.isoformat()}),
        "schedule_type": Schedule.ONCE,
        "repeats": -1,
        "next_run": fire_at,
    }
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(name=SCHEDULE_NAME).order_by("id").first()
        if schedule is None:
            Schedule.objects.create(name=SCHEDULE_NAME, **fields)
            return True
        if schedule.next_run is not None and schedule.next_run <= fire_at:
            return False
        for name, value in fields.items():
            setattr(schedule, name, value)
        schedule.save(update_fields=list(fields))
        Schedule.objects.filter(name=SCHEDULE_NAME).exclude(pk=schedule.pk).delete()
    return True


def parse(at: str | datetime | None) -> datetime | None:
    """A wake task's ``at`` (an ISO time, as queued, or a datetime)."""
    return datetime.fromisoformat(at) if isinstance(at, str) else at


def hold(at: datetime) -> bool:
    """A wake task about to start its timer for ``at`` takes the `Wake` row, so that a tick
    that arms the same time meanwhile queues no second wake task (the schedule queues its
    task without the row)."""
    return clock_runs() and _take(at, clock.now())


def start_timer(seconds: float, then: Callable[[], None]) -> None:
    """Call ``then`` in ``seconds``, in a thread of this process: a daemon, so that a worker
    django-q2 recycles or stops is not kept alive by it (its wake-up is then armed again
    by a tick, `LOST_AFTER_S`)."""

    def run() -> None:
        try:
            then()
        finally:
            connections.close_all()  # this thread's own connections

    timer = threading.Timer(seconds, run)
    timer.daemon = True
    timer.name = "events: wake timer"
    timer.start()


def wait_for(at: datetime, now: datetime | None = None) -> float:
    """Start the timer that queues the wake task for ``at`` again once it is due (at most
    ``TIMER_MAX_S`` from now: a wake task fired early by the schedule waits again); answers
    the seconds it waits. Nothing here sleeps: the worker is free at once."""
    now = now or clock.now()
    seconds = min(TIMER_MAX_S, (at - now).total_seconds())
    hold(at)

    def ring() -> None:
        try:
            queue(at)
        except Exception:
            logger.exception("could not queue the wake-up for %s; the tick is the backstop", at)

    start_timer(seconds, ring)
    return seconds


def waits(at: datetime | None, now: datetime | None = None) -> bool:
    """Is ``at`` still ahead, so that its wake task starts a timer rather than ticking?"""
    now = now or clock.now()
    return at is not None and (at - now).total_seconds() > DUE_WITHIN_S


def wake(at: str | datetime | None, now: datetime | None = None) -> str | None:
    """The wake task for ``at``: while ``at`` is ahead, start its timer and answer so; once
    due, free the `Wake` row and answer None, for the caller to tick, or, when the work it
    was armed for is moot, arm the next wake-up and answer so (no tick)."""
    when = parse(at)
    now = now or clock.now()
    if when is not None and waits(when, now):
        seconds = wait_for(when, now)
        return f"wake at {when.isoformat()}: its timer goes off in {seconds:.1f} s"
    woke(when)
    if when is not None and not due_by(when, now):
        arm_next(now)
        return f"wake at {when.isoformat()}: nothing fell due, no tick"
    return None


def woke(at: datetime | None) -> int:
    """The wake task for ``at`` woke: a later time may now be armed."""
    return Wake.objects.filter(pk=WAKE_ROW, at=at).update(at=None)
