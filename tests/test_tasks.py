"""django-q2: the schedule is ensured by name, work is queued when it appears."""

import pytest
from django.core.management import call_command
from django_q.models import Schedule
from django_q.signals import post_spawn

from cleanup import registry, tasks
from cleanup.tasks import SCHEDULE_NAME, ensure_schedule, queue_cleanup
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def a_worker_not_yet_started(monkeypatch):
    """Each test's ``post_spawn`` is a worker process's first (the pytest process's pid is
    every test's)."""
    monkeypatch.setattr(tasks, "_started_in", None)


def test_the_schedule_exists_once_however_often_it_is_ensured():
    ensure_schedule()
    ensure_schedule()
    call_command("migrate", verbosity=0)
    schedules = Schedule.objects.filter(name=SCHEDULE_NAME)
    assert schedules.count() == 1
    assert schedules.get().func == "cleanup.tasks.tick_task"
    assert schedules.get().repeats == -1


def test_a_duplicate_schedule_left_behind_is_removed():
    ensure_schedule()
    Schedule.objects.create(name=SCHEDULE_NAME, func="cleanup.tasks.sweep_task", schedule_type=Schedule.MINUTES)
    ensure_schedule()
    assert Schedule.objects.filter(name=SCHEDULE_NAME).count() == 1


def test_a_worker_start_ensures_the_schedule(django_capture_on_commit_callbacks):
    Schedule.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=True):
        post_spawn.send(sender="django_q", proc_name="Process-1:1")
        post_spawn.send(sender="django_q", proc_name="Process-1:2")
    assert Schedule.objects.filter(name=SCHEDULE_NAME).count() == 1


def test_a_changed_schedule_is_put_back():
    schedule = ensure_schedule()
    Schedule.objects.filter(pk=schedule.pk).update(func="somewhere.else", minutes=60)
    ensure_schedule()
    schedule.refresh_from_db()
    assert (schedule.func, schedule.minutes) == ("cleanup.tasks.tick_task", 1)


def test_a_queued_cleanup_runs_once_the_transaction_commits(django_capture_on_commit_callbacks):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        queue_cleanup(run.pk, actor="erin")
        assert set(states(run).values()) == {"live"}, "the task ran before the commit"

    assert len(callbacks) == 1
    assert set(states(run).values()) == {"reverted"}


def test_a_worker_that_starts_reconciles_every_module(django_capture_on_commit_callbacks):
    reconcile = Scripted({"ok": True, "in_force": []})
    registry.register_action(FakeAction(reconcile=reconcile))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    with django_capture_on_commit_callbacks(execute=True):
        post_spawn.send(sender="django_q", proc_name="Process-1:1")

    assert len(reconcile.calls) == 1
    assert states(run)["orc-1"] == "orphaned"


def test_backend_restarted_queues_a_reconcile_that_looks_back(django_capture_on_commit_callbacks):
    world = {"orc-1"}
    registry.register_action(
        FakeAction(
            revert=Scripted({"ok": True, "failed": []}),
            reconcile=lambda **kw: {"ok": True, "in_force": [r["ref"] for r in kw["resources"] if r["ref"] in world]},
        )
    )
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    call_command("sweep", stdout=open("/dev/null", "w"))

    with django_capture_on_commit_callbacks(execute=True):
        registry.backend_restarted("test")

    # The reconcile found orc-1 back, and queued the sweep that gave it back again.
    assert list(run.resources.order_by("id").values_list("state", flat=True)) == ["reverted", "reverted"]


def test_a_worker_running_its_tasks_inline_queues_its_start_up_work_once(monkeypatch):
    """With ``Q_SYNC`` on, a cluster's worker runs each task inside itself, and django-q2
    says so with ``post_spawn`` under the worker's own name: the start-up work is queued
    when the worker starts, not again for each task it runs (nor inside itself, without end)."""
    queued = []

    def queue_startup():
        queued.append(1)
        # The start-up task, run inline, starts a worker inside this one.
        post_spawn.send(sender="django_q", proc_name="Process-1:1")

    monkeypatch.setattr(tasks, "queue_startup", queue_startup)
    post_spawn.send(sender="django_q", proc_name="Process-1:1")
    post_spawn.send(sender="django_q", proc_name="Process-1:1")  # a later task, inline
    assert queued == [1]
