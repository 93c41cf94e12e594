"""The engine's own clock: work due at a known time is looked at then, not at the next minute
(rule 32).

django-q2 has no delayed tasks, and its scheduler looks for due schedules only every 30 s,
so a ``core.wait(2)`` left to the minute tick ends up to a minute late, and a backend a
person marks up resumes its work at the next tick. Whenever the engine knows when work
falls due (a run's ``wake_at``: a wait, a step's backoff, a step held by a down backend;
a ledger row's ``next_attempt_at``: a backoff, a resume spread after a mark-up), it arms
a wake-up for that time:

- due within ``SLEEP_MAX_S``: a wake task is queued now; it sleeps until the time, then
  ticks (`cleanup.tasks.wake_task`). It holds one worker while it sleeps, at most
  ``SLEEP_MAX_S``.
- due later: one django-q2 schedule, ``events: wake`` (run once), is set early enough that
  its 30 s scheduler queues the wake task before the time; the task sleeps the rest.

Many runs waiting at once hold one sleeping worker, not one each: the one `Wake` row says
which time a wake task already sleeps towards, and only an earlier time takes it over (a
conditional UPDATE). Every tick ends by arming the next wake-up from the data itself
(`arm_next`), so a wake-up that lost to an earlier one, or whose task was lost, is armed
again by the tick before it; the minute tick stays the backstop.

In django-q2's sync mode (the tests) a queued task runs in the caller, so there is no
clock to sleep on: nothing is armed.
May import: the models, conf and `enqueue`; imported by the runner, `outages` and the tasks.
"""

import logging
import time
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Min, Q
from django.utils import timezone

from . import rows
from .conf import WAKE_SLEEP_MAX_S, max_revert_attempts
from .enqueue import WAKE, enqueue
from .models import Resource, Run, RunStatus, Wake

logger = logging.getLogger(__name__)

# The longest a wake task sleeps, holding its worker.
SLEEP_MAX_S = WAKE_SLEEP_MAX_S
# django-q2's scheduler looks for due schedules this often (its Sentinel's fixed cycle).
SCHEDULER_EVERY_S = 30
# A wake armed this long ago whose task never cleared it was lost: a later arm takes it over.
LOST_AFTER_S = 30
SCHEDULE_NAME = "events: wake"
WAKE_ROW = 1


def clock_runs():
    """Is there a cluster to sleep in? Not in django-q2's sync mode, where a task runs in
    its caller (read from django-q2's configuration, which it reads once at import)."""
    from django_q.conf import Conf

    return not Conf.SYNC


def next_due(now=None):
    """The earliest time after ``now`` at which the engine has work: a running run's
    ``wake_at``, or a ledger row the sweep would claim once its ``next_attempt_at`` passes."""
    now = now or timezone.now()
    run_at = Run.objects.filter(status=RunStatus.RUNNING, wake_at__gt=now).aggregate(at=Min("wake_at"))["at"]
    max_attempts = max_revert_attempts()
    row_at = Resource.objects.filter(rows.backing_off(now, max_attempts) & rows.in_automatic_sweep()).aggregate(
        at=Min("next_attempt_at")
    )["at"]
    times = [at for at in (run_at, row_at) if at is not None]
    return min(times) if times else None


def arm_next(now=None):
    """Arm the wake-up for the earliest work due after ``now`` (`next_due`); answers its time."""
    if not clock_runs():
        return None
    now = now or timezone.now()
    at = next_due(now)
    if at is not None:
        arm(at, now)
    return at


def arm(at, now=None):
    """Make sure the engine wakes at ``at``; answers how: "queued", "scheduled", or None
    when a wake-up at or before it is already armed (or there is no clock)."""
    if at is None or not clock_runs():
        return None
    now = now or timezone.now()
    if at - now > timedelta(seconds=SLEEP_MAX_S):
        return "scheduled" if _schedule(at) else None
    if not _take(at, now):
        return None
    enqueue(WAKE, at=at.isoformat(), task_name=f"wake at {at.isoformat(timespec='seconds')}")
    return "queued"


def _take(at, now):
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


def _schedule(at):
    """Set the one ``events: wake`` schedule so that the scheduler queues a wake task before
    ``at``; an earlier one is left as it is (its tick arms the next). True when it changed."""
    from django_q.models import Schedule

    fire_at = at - timedelta(seconds=SLEEP_MAX_S - 5)
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


def _parse(at):
    return datetime.fromisoformat(at) if isinstance(at, str) else at


def hold(at):
    """A wake task about to sleep towards ``at`` takes the `Wake` row, so that a tick that
    arms the same time meanwhile queues no second sleeper (the schedule queues its task
    without the row)."""
    at = _parse(at)
    return bool(at) and clock_runs() and _take(at, timezone.now())


def sleep_until(at, sleep=None):
    """Sleep until ``at`` (an ISO time or a datetime), at most ``SLEEP_MAX_S``; answers the
    seconds slept."""
    at = _parse(at)
    seconds = min(SLEEP_MAX_S, (at - timezone.now()).total_seconds()) if at else 0
    if seconds > 0:
        (sleep or time.sleep)(seconds)
        return seconds
    return 0


def woke(at):
    """The wake task for ``at`` woke: a later time may now be armed."""
    at = _parse(at)
    return Wake.objects.filter(pk=WAKE_ROW, at=at).update(at=None)
