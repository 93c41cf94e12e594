"""The engine's own wake-up (`cleanup.wakeup`): waits, backoffs and resumes fall due on time,
not at the next minute tick. The tests run django-q2 in sync mode, which has no clock; here
the clock is switched on and what would be queued is captured instead of run. The real
cluster, on the ORM broker and on Redis, is in tests/test_wakeup_cluster.py."""

from datetime import datetime, timedelta
from unittest import mock

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone
from django_q.models import Schedule

from cleanup import outages, registry, tasks, wakeup
from cleanup.enqueue import WAKE
from cleanup.models import ModuleHealth, Resource, Run, RunStatus, Step, StepStatus, Wake
from cleanup.runner import start_run, tick
from tests.fakes import FakeAction, Scripted, despawner, make_rows, make_run, make_step, spawner

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock():
    """The clock on (a cluster to keep time in); the wake tasks it would queue, as ``(at, ...)``."""
    queued = []

    def enqueue(func, *args, **kwargs):
        assert func == WAKE
        queued.append(datetime.fromisoformat(kwargs["at"]))

    with mock.patch.object(wakeup, "clock_runs", return_value=True), mock.patch.object(wakeup, "enqueue", enqueue):
        yield queued


def test_a_wait_arms_a_wake_up_at_its_end(clock):
    run = start_run("short wait", [{"action": "core.wait", "params": {"seconds": 2}}])
    tick()
    wait = run.steps.get()
    assert wait.status == StepStatus.RUNNING
    assert clock == [wait.started_at + timedelta(seconds=2)], "no wake-up queued for the wait's end"


def test_the_wake_task_holds_no_worker_its_timer_queues_it_again_and_then_it_ticks(clock):
    run = start_run("short wait", [{"action": "core.wait", "params": {"seconds": 1}}])
    tick()
    wait = run.steps.get()
    at = wait.started_at + timedelta(seconds=1)
    clock.clear()
    timers = []

    with mock.patch.object(wakeup, "start_timer", lambda seconds, then: timers.append((seconds, then))):
        line = tasks.wake_task(at=at.isoformat())

    assert [s for s, _ in timers] and 0 < timers[0][0] <= 1, "no timer was set for the wait's end"
    assert "timer" in line
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING, "the wake task ticked before its time"
    assert Wake.objects.get().at == at, "the timer's time is not held: a tick would queue a second"

    with time_machine.travel(at + timedelta(milliseconds=10), tick=False):
        timers[0][1]()  # the timer goes off: the wake task is queued again, now due
        assert clock == [at]
        tasks.wake_task(at=at.isoformat())
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, "the due wake task did not end the wait"
    wait.refresh_from_db()
    assert wait.finished_at >= at
    assert Wake.objects.get().at is None


def test_a_wake_up_made_moot_before_its_time_ticks_not_and_arms_the_next(clock, settings):
    now = timezone.now()
    run = make_run(status=RunStatus.COMPLETED)
    step = make_step(run)
    make_rows(step, ["a", "b"], placeholder=False)
    Resource.objects.filter(ref="a").update(next_attempt_at=now + timedelta(seconds=3))
    Resource.objects.filter(ref="b").update(next_attempt_at=now + timedelta(seconds=20))
    assert wakeup.arm(now + timedelta(seconds=3), now) == "queued"
    Resource.objects.filter(ref="a").update(state="reverted")  # given back meanwhile
    clock.clear()

    with mock.patch("cleanup.runner.tick") as ticked:
        line = wakeup.wake((now + timedelta(seconds=3)).isoformat(), now + timedelta(seconds=3))

    assert "no tick" in line and not ticked.called
    assert clock == [now + timedelta(seconds=20)], "the next wake-up was not armed"
    # Work due by then: the wake-up ticks.
    assert wakeup.wake((now + timedelta(seconds=20)).isoformat(), now + timedelta(seconds=20)) is None


def test_many_waits_keep_one_timer_for_the_earliest_and_an_earlier_one_takes_over(clock):
    now = timezone.now()
    assert wakeup.arm(now + timedelta(seconds=10), now) == "queued"
    assert wakeup.arm(now + timedelta(seconds=20), now) is None, "a later wake-up queued a second wake task"
    assert wakeup.arm(now + timedelta(seconds=10), now) is None
    assert wakeup.arm(now + timedelta(seconds=5), now) == "queued", "an earlier wake-up waited for the later"
    assert clock == [now + timedelta(seconds=10), now + timedelta(seconds=5)]
    assert Wake.objects.get().at == now + timedelta(seconds=5)


def test_a_woken_wake_up_frees_the_row_and_a_lost_one_is_taken_over(clock):
    now = timezone.now()
    wakeup.arm(now + timedelta(seconds=5), now)
    wakeup.woke((now + timedelta(seconds=5)).isoformat())
    assert wakeup.arm(now + timedelta(seconds=20), now) == "queued", "a woken wake-up kept the row"

    later = now + timedelta(seconds=20 + wakeup.LOST_AFTER_S + 1)
    assert wakeup.arm(later + timedelta(seconds=3), later) == "queued", "a lost wake-up kept the row for ever"


def test_a_far_wait_sets_the_wake_schedule_early_enough_for_the_scheduler(clock):
    now = timezone.now()
    at = now + timedelta(hours=1)
    assert wakeup.arm(at, now) == "scheduled"
    schedule = Schedule.objects.get(name=wakeup.SCHEDULE_NAME)
    assert schedule.func == WAKE and schedule.schedule_type == Schedule.ONCE
    lead = (at - schedule.next_run).total_seconds()
    # django-q2's scheduler looks every 30 s: fired by then, the task's timer waits the rest.
    assert wakeup.SCHEDULER_EVERY_S < lead <= wakeup.TIMER_MAX_S
    assert clock == [], "a wake task was queued for a wait an hour away"

    assert wakeup.arm(at + timedelta(hours=1), now) is None, "a later time moved the schedule away"
    assert wakeup.arm(at - timedelta(minutes=30), now) == "scheduled"
    assert Schedule.objects.filter(name=wakeup.SCHEDULE_NAME).count() == 1
    assert Schedule.objects.get(name=wakeup.SCHEDULE_NAME).next_run < schedule.next_run


def test_each_tick_arms_the_next_due_work_from_the_data(clock):
    now = timezone.now()
    Run.objects.create(name="backing off", wake_at=now + timedelta(seconds=7))
    Run.objects.create(name="later", wake_at=now + timedelta(seconds=30))
    with time_machine.travel(now, tick=False):
        tick()
    assert clock == [now + timedelta(seconds=7)]


def test_a_row_waiting_out_its_backoff_is_due_at_its_time():
    now = timezone.now()
    run = make_run(status=RunStatus.COMPLETED)
    step = make_step(run)
    make_rows(step, ["a", "b"])
    Resource.objects.filter(ref="a").update(next_attempt_at=now + timedelta(seconds=3))
    Resource.objects.filter(ref="b").update(next_attempt_at=now + timedelta(seconds=9))
    assert wakeup.next_due(now) == now + timedelta(seconds=3)
    Resource.objects.filter(ref="a").update(revert_attempts=3)  # at the ceiling: nothing is due
    assert wakeup.next_due(now) == now + timedelta(seconds=9)


def test_a_person_marking_a_backend_up_resumes_its_held_step_at_once(clock):
    world = {}
    registry.register_action(FakeAction(perform=Scripted(spawner(world)), revert=Scripted(despawner(world))))
    start = timezone.now()
    with override_settings(EVENT_OUTAGE_PROBE_S=15), time_machine.travel(start, tick=False) as moment:
        outages.mark_down("test", by="alice", reason="maintenance")
        run = start_run("held", [{"action": "test.spawn", "params": {"count": 1}}])
        tick()
        step = run.steps.get()
        assert step.next_attempt_at > start and step.status == StepStatus.PENDING, "the step was not held"
        moment.shift(timedelta(seconds=3))
        clock.clear()

        assert outages.mark_up("test", by="alice")

        now = timezone.now()
        step.refresh_from_db()
        run.refresh_from_db()
        assert step.next_attempt_at <= now and run.wake_at <= now, "the held step still waits for its probe"
        assert clock == [now], "nothing woke the engine when the backend came back"
        tick()
    step.refresh_from_db()
    assert (step.status, step.attempts) == (StepStatus.DONE, 1), "the resumed step was not performed"


def test_a_backend_marked_up_wakes_the_engine_as_each_bucket_of_its_rows_falls_due(clock):
    registry.register_action(FakeAction())
    start = timezone.now()
    with override_settings(EVENT_OUTAGE_SPREAD_S=5), time_machine.travel(start, tick=False):
        run = make_run(status=RunStatus.COMPLETED)
        for position in range(4):
            make_rows(make_step(run, position=position), [f"r{position}"])
        probe_at = start + timedelta(seconds=12)
        ModuleHealth.objects.create(module="test", state="down", down_since=start, held=True, next_probe_at=probe_at)
        Resource.objects.update(next_attempt_at=probe_at)  # deferred to the next probe (`defer_waiting`)
        own = make_rows(make_step(run, position=9), ["own"])[0]
        Resource.objects.filter(pk=own.pk).update(next_attempt_at=start + timedelta(minutes=1))
        outages.mark_up("test", by="alice")
        spread = Resource.objects.exclude(pk=own.pk).values_list("next_attempt_at", flat=True)
        due = sorted({at for at in spread if at > start})
        assert due, "the rows were not spread"
        assert wakeup.arm_next(start) == due[0]
    assert max(spread) <= start + timedelta(seconds=5), "a row still waits for the probe it was deferred to"
    assert Resource.objects.get(pk=own.pk).next_attempt_at == start + timedelta(minutes=1), "its own backoff was cut"
    assert clock == [start], "the mark-up armed no wake-up at once"


def test_in_sync_mode_nothing_is_armed():
    now = timezone.now()
    with mock.patch.object(wakeup, "enqueue") as enqueue:
        assert wakeup.arm(now + timedelta(seconds=2), now) is None
        assert wakeup.arm_next(now) is None
    enqueue.assert_not_called()
    assert not Wake.objects.exists()
    assert not Step.objects.exists()


def test_a_runs_cleanup_that_leaves_a_row_backing_off_wakes_when_its_backoff_ends(clock, settings):
    settings.EVENT_REVERT_BACKOFF_S = 20
    registry.register_action(FakeAction(revert=Scripted({"ok": False, "error": "in combat", "retry": True})))
    run = make_run(status=RunStatus.COMPLETED)
    [row] = make_rows(make_step(run), ["wolf-1"], placeholder=False)

    tasks.cleanup_run_task(run.pk)

    row.refresh_from_db()
    assert row.next_attempt_at is not None and row.state == "failed"
    assert clock == [row.next_attempt_at], "the row's retry was left to the minute tick"
