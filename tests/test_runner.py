"""Runs perform their steps through the ledger and every ending leads to cleanup."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import registry
from cleanup.models import CleanupStatus, Resource, Run, RunStatus, Step
from cleanup.runner import start_run, tick
from tests.fakes import FakeAction, FakeLease, Scripted, despawner, log_kinds, spawner
from tests.test_cleanup_failure_shapes import FAILURES

pytestmark = pytest.mark.django_db

DOWN = {"ok": False, "error": "shard is down"}


def spawn(count=2, creature="orc"):
    return {"action": "test.spawn", "params": {"creature": creature, "count": count}}


def test_a_run_performs_in_order_holds_at_the_wait_completes_and_is_given_back(world):
    lease = registry.register_lease(FakeLease(values={"camp": 1}))
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        run = start_run(
            "invasion",
            [
                spawn(2, "orc"),
                {"action": "core.lease", "params": {"lease": "test.rate", "target": "camp", "value": 5}},
                {"action": "core.wait", "params": {"seconds": 60}},
                spawn(3, "wolf"),
            ],
        )

        tick()
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING
        assert len(world) == 2 and lease.values["camp"] == 5
        assert run.wake_at == start + timedelta(seconds=60)

        clock.shift(timedelta(seconds=30))
        tick()
        assert len(world) == 2, "the run did not hold at the wait"

        clock.shift(timedelta(seconds=31))
        tick()

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.cleanup_status == CleanupStatus.COMPLETE, "the run was not cleaned in the tick it completed"
    assert world == {}
    assert lease.values["camp"] == 1
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {"reverted"}
    kinds = log_kinds(run)
    assert kinds[:7] == [
        "run.started",
        "step.performed",
        "step.performed",
        "step.waiting",
        "step.performed",
        "step.performed",
        "run.completed",
    ]
    assert "cleanup.swept" in kinds
    lease_row = Resource.objects.get(run=run, kind="override")
    assert (lease_row.ref, lease_row.payload["baseline"], lease_row.payload["applied"]) == ("test.rate#camp", 1, 5)


@override_settings(EVENT_STEP_BACKOFF_S=0)
def test_a_step_failing_twice_then_succeeding_completes(world):
    perform = Scripted(DOWN, DOWN, spawner(world))
    registry.unregister_module("test")
    registry.register_action(FakeAction(perform=perform, revert=Scripted(despawner(world))))
    run = start_run("retry", [spawn(1)])

    for _ in range(3):
        tick()

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    step = run.steps.get()
    assert (step.status, step.attempts) == ("done", 3)
    assert len({c["idempotency_key"] for c in perform.calls}) == 1, "a retry changed the idempotency key"
    assert log_kinds(run).count("step.failed") == 2


def test_a_failed_step_waits_out_its_backoff(world):
    perform = Scripted(DOWN, spawner(world))
    registry.unregister_module("test")
    registry.register_action(FakeAction(perform=perform, revert=Scripted(despawner(world))))
    start = timezone.now()
    with override_settings(EVENT_STEP_BACKOFF_S=10), time_machine.travel(start, tick=False) as clock:
        run = start_run("backoff", [spawn(1)])
        tick()
        clock.shift(timedelta(seconds=9))
        tick()
        assert len(perform.calls) == 1
        clock.shift(timedelta(seconds=2))
        tick()
    assert len(perform.calls) == 2
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


@override_settings(EVENT_STEP_BACKOFF_S=0, EVENT_STEP_MAX_ATTEMPTS=3)
def test_a_step_failing_three_times_aborts_and_gives_back_the_earlier_steps(world):
    registry.register_action(FakeAction(id="test.break", perform=Scripted(DOWN)))
    run = start_run("doomed", [spawn(2), {"action": "test.break", "params": {}}, spawn(1)])

    for _ in range(4):
        tick()

    run.refresh_from_db()
    assert run.status == RunStatus.ABORTED
    assert run.cleanup_status == CleanupStatus.COMPLETE
    assert world == {}
    broken = run.steps.get(position=1)
    assert (broken.status, broken.attempts, broken.last_error) == ("failed", 3, "shard is down")
    after = run.steps.get(position=2)
    assert (after.status, after.attempts) == ("cancelled", 0), "a step after the failure was performed"
    assert run.log.get(kind="run.aborted").detail["error"] == "shard is down"


def test_retry_false_aborts_at_once(world):
    refuse = Scripted({"ok": False, "error": "no such creature type", "retry": False})
    registry.register_action(FakeAction(id="test.break", perform=refuse))
    run = start_run("refused", [spawn(1), {"action": "test.break", "params": {}}])

    tick()

    run.refresh_from_db()
    assert run.status == RunStatus.ABORTED
    assert len(refuse.calls) == 1
    assert world == {}


PERFORM_FAILURES = {
    "a timeout": FAILURES["a timeout"],
    "an exception": FAILURES["an exception"],
    "None": None,
    "a list": [{"kind": "creature", "ref": "orc-1"}],
    "a string": "ok",
    "ok is the string yes": {"ok": "yes", "resources": [{"kind": "creature", "ref": "orc-1"}]},
    "ok is 1": {"ok": 1, "resources": [{"kind": "creature", "ref": "orc-1"}]},
    "a dict without ok": {"resources": [{"kind": "creature", "ref": "orc-1"}]},
    "resources is not a list": {"ok": True, "resources": "orc-1"},
    "a resource without a ref": {"ok": True, "resources": [{"kind": "creature"}]},
}


@pytest.mark.parametrize("shape", PERFORM_FAILURES)
@override_settings(EVENT_STEP_BACKOFF_S=0)
def test_a_perform_answer_that_is_not_success_never_counts_as_performed(shape):
    perform = Scripted(PERFORM_FAILURES[shape])
    registry.register_action(FakeAction(perform=perform, revert=Scripted({"ok": True}), budget_ms=100))
    run = start_run("shapes", [spawn(1)])

    tick()

    step = run.steps.get()
    assert (step.status, step.attempts) == ("pending", 1)
    assert step.last_error
    assert not Resource.objects.filter(run=run).exclude(kind="step").exists()
    assert run.log.filter(kind="step.performed").count() == 0
    assert run.log.get(kind="step.failed").detail["retrying"] is True


def test_rows_of_an_aborted_run_are_pending_cleanup_before_the_sweep(world):
    registry.register_action(FakeAction(id="test.break", perform=Scripted({"ok": False, "retry": False})))
    run = start_run("x", [spawn(1), {"action": "test.break", "params": {}}])
    from cleanup.runner import advance

    advance()
    run.refresh_from_db()
    assert (run.status, run.cleanup_status) == (RunStatus.ABORTED, CleanupStatus.PENDING)


@override_settings(EVENT_RUN_BATCH=2)
def test_a_tick_that_reached_its_bound_queues_the_next(world, django_capture_on_commit_callbacks):
    for i in range(3):
        start_run(f"r{i}", [spawn(1)])
    with django_capture_on_commit_callbacks(execute=True):
        tick()
    # The queued tick ran at once (django-q2 runs in-process in the tests): all three done.
    assert set(Run.objects.values_list("status", flat=True)) == {"completed"}
    assert Step.objects.filter(status="done").count() == 3
