"""A pass that stops at a bound with work left queues the next pass itself, however few
runs wait: the schedule is only the backstop."""

import pytest
from django.test import override_settings

from cleanup import registry
from cleanup.enqueue import queue_cleanup, queue_sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


def a_run_of(groups):
    run = make_run()
    for i in range(groups):
        make_rows(make_step(run), [f"orc-{i}"])
    return run


@override_settings(EVENT_CLEANUP_GROUPS_PER_RUN=2, EVENT_CLEANUP_RUN_BATCH=10)
def test_a_sweep_stopped_at_the_groups_per_run_queues_the_next(django_capture_on_commit_callbacks):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = a_run_of(5)

    with django_capture_on_commit_callbacks(execute=True):
        queue_sweep()

    assert set(states(run).values()) == {"reverted"}


@override_settings(EVENT_CLEANUP_GROUPS_PER_RUN=2)
def test_a_runs_cleanup_stopped_at_the_groups_per_run_queues_the_next(django_capture_on_commit_callbacks):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = a_run_of(5)

    with django_capture_on_commit_callbacks(execute=True):
        queue_cleanup(run.pk)

    assert set(states(run).values()) == {"reverted"}


@override_settings(EVENT_CLEANUP_GROUPS_PER_RUN=2, EVENT_REVERT_BACKOFF_S=30)
def test_a_pass_whose_groups_wait_out_a_backoff_queues_nothing(django_capture_on_commit_callbacks):
    revert = Scripted({"ok": False, "error": "down"})
    registry.register_action(FakeAction(revert=revert))
    run = a_run_of(2)

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        queue_cleanup(run.pk)

    assert len(revert.calls) == 2
    assert len(callbacks) == 1, "a pass with nothing left to do now queued another"


@override_settings(EVENT_CLEANUP_GROUPS_PER_RUN=2)
def test_a_runs_pass_that_leaves_groups_queues_the_next_before_its_calls(monkeypatch):
    from cleanup import tasks

    queued, seen_at_call = [], []
    monkeypatch.setattr(tasks, "queue_cleanup", lambda run_id, actor=None: queued.append(run_id))

    def revert(**kwargs):
        seen_at_call.append(len(queued))
        return {"ok": True, "failed": []}

    registry.register_action(FakeAction(revert=revert))
    run = a_run_of(5)

    tasks.cleanup_run_task(run.pk)

    assert queued == [run.pk], "the next pass was not queued once"
    assert seen_at_call == [1, 1], "the next pass was queued only after the calls"


@override_settings(EVENT_CLEANUP_GROUPS_PER_RUN=2)
def test_a_runs_last_pass_queues_nothing(monkeypatch):
    from cleanup import tasks

    queued = []
    monkeypatch.setattr(tasks, "queue_cleanup", lambda run_id, actor=None: queued.append(run_id))
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = a_run_of(2)

    tasks.cleanup_run_task(run.pk)

    assert queued == []
    assert set(states(run).values()) == {"reverted"}


@override_settings(EVENT_CLEANUP_RUN_BATCH=1)
def test_a_sweep_that_leaves_runs_queues_the_next_before_its_calls(monkeypatch):
    from cleanup import tasks

    queued, seen_at_call = [], []
    monkeypatch.setattr(tasks, "queue_sweep", lambda: queued.append("sweep"))

    def revert(**kwargs):
        seen_at_call.append(len(queued))
        return {"ok": True, "failed": []}

    registry.register_action(FakeAction(revert=revert))
    a_run_of(1), a_run_of(1)

    tasks.sweep_task()

    assert queued == ["sweep"]
    assert seen_at_call == [1]
