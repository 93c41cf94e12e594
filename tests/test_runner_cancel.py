"""Cancel: with cleanup, without it (rule 7), during a step, and of an ended run."""

import pytest
from django.core.management import CommandError, call_command

from cleanup import alerts, ledger, registry
from cleanup.models import CleanupStatus, LogKind, Resource, Run, RunLog, RunStatus, Step, StepStatus
from cleanup.runner import RunStateError, cancel_run, start_run, tick
from cleanup.sweep import cleanup_run, sweep
from tests.fakes import FakeAction, Scripted, despawner, log_kinds, spawner

pytestmark = pytest.mark.django_db


def started(world):
    run = start_run(
        "festival",
        [
            {"action": "test.spawn", "params": {"count": 2}},
            {"action": "core.wait", "params": {"seconds": 3600}},
            {"action": "test.spawn", "params": {"count": 2}},
        ],
    )
    tick()
    assert len(world) == 2
    return run


def test_cancel_with_cleanup_gives_back_at_once(world, django_capture_on_commit_callbacks):
    run = started(world)

    with django_capture_on_commit_callbacks(execute=True) as queued:
        cancel_run(run.pk, actor="gm-ann")

    assert len(queued) == 1, "the cleanup was not queued at once"
    run.refresh_from_db()
    assert (run.status, run.cleanup_status) == (RunStatus.CANCELLED, CleanupStatus.COMPLETE)
    assert world == {}
    assert run.log.get(kind="run.cancelled").detail == {"by": "gm-ann", "cleanup": True}
    tick()
    after = run.steps.get(position=2)
    assert (after.status, after.attempts) == (StepStatus.CANCELLED, 0), "a cancelled run went on"


def test_the_steps_a_cancelled_run_never_finished_read_cancelled_and_its_done_steps_stay_done(world):
    run = started(world)
    wait = run.steps.get(position=1)
    assert wait.status == StepStatus.RUNNING, "the wait holds the run"

    cancel_run(run.pk, actor="gm-ann")

    statuses = dict(run.steps.values_list("position", "status"))
    assert statuses == {0: StepStatus.DONE, 1: StepStatus.CANCELLED, 2: StepStatus.CANCELLED}
    wait.refresh_from_db()
    assert wait.finished_at is not None


def test_cancel_without_cleanup_leaves_the_rows_for_a_person(world, django_capture_on_commit_callbacks):
    run = started(world)

    with django_capture_on_commit_callbacks(execute=True):
        cancel_run(run.pk, cleanup=False, actor="gm-ann")
    sweep()
    tick()

    run.refresh_from_db()
    # Left for later on purpose: not a cleanup that gave up, and staff get no alert for it.
    assert alerts.notice(deliver_now=False) == 0
    assert (run.status, run.cleanup_status) == (RunStatus.CANCELLED, CleanupStatus.LEFT)
    assert not RunLog.objects.filter(run=run, kind=LogKind.CLEANUP_GAVE_UP).exists()
    assert len(world) == 2
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {"live"}

    cleanup_run(run, reset=True, actor="gm-bob")
    assert world == {}
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE


def test_cancel_of_an_ended_run_is_refused(world):
    run = started(world)
    cancel_run(run.pk)
    with pytest.raises(RunStateError, match=f"run {run.pk} is already cancelled"):
        cancel_run(run.pk)
    assert log_kinds(run).count("run.cancelled") == 1


def test_cancel_commands_say_what_is_wrong(world):
    run = started(world)
    with pytest.raises(CommandError, match="there is no run 999"):
        call_command("cancel_run", "999")
    call_command("cancel_run", str(run.pk), "--no-cleanup", stdout=open("/dev/null", "w"))
    with pytest.raises(CommandError, match="already cancelled"):
        call_command("cancel_run", str(run.pk))


def test_a_step_that_died_after_its_placeholder_gets_a_revert_with_its_key(world):
    """A worker died mid-perform: only the placeholder is in the ledger."""
    run = start_run("crash", [{"action": "test.spawn", "params": {"count": 3}}])
    step = run.steps.get()
    ledger.write_placeholder(step, "test")
    # What the dead worker made before it died, known to the module by the step's key.
    world.update({f"orc-ghost-{i}": step.idempotency_key for i in range(3)})
    step.status, step.attempts = StepStatus.RUNNING, 1
    step.save()

    cancel_run(run.pk)
    sweep()

    revert = registry.get_action("test.spawn").revert
    assert revert.calls == [{"run_id": run.pk, "resources": [], "idempotency_key": step.idempotency_key}]
    assert world == {}
    assert Resource.objects.get(run=run).state == "reverted"


def test_a_step_whose_ticker_died_is_performed_again_with_the_same_key(world):
    from datetime import timedelta

    import time_machine
    from django.utils import timezone

    run = start_run("crash", [{"action": "test.spawn", "params": {"count": 1}}])
    step = run.steps.get()
    ledger.write_placeholder(step, "test")
    step.status, step.attempts = StepStatus.RUNNING, 1
    step.save()
    Run.objects.filter(pk=run.pk).update(
        claim_token="00000000-0000-0000-0000-000000000001",
        claim_expires_at=timezone.now() + timedelta(seconds=120),
    )

    tick()
    assert registry.get_action("test.spawn")._perform.calls == [], "a live claim was taken"

    with time_machine.travel(timezone.now() + timedelta(seconds=121), tick=False):
        tick()

    perform = registry.get_action("test.spawn")._perform
    assert [c["idempotency_key"] for c in perform.calls] == [step.idempotency_key]
    step.refresh_from_db()
    assert (step.status, step.attempts) == ("done", 2)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert Resource.objects.filter(run=run, kind="step").count() == 1, "the placeholder was written twice"


@pytest.mark.django_db(transaction=True)
def test_a_step_performing_while_its_run_is_cancelled_still_ledgers_and_gives_back():
    world = {}
    make = spawner(world)

    def perform_while_cancelled(**kwargs):
        answer = make(**kwargs)
        cancel_run(kwargs["run_id"], actor="gm-cy")  # from another connection, mid-perform
        return answer

    registry.register_action(FakeAction(perform=perform_while_cancelled, revert=Scripted(despawner(world))))
    run = start_run(
        "race",
        [
            {"action": "test.spawn", "params": {"count": 2}},
            {"action": "test.spawn", "params": {"count": 2}},
        ],
    )

    tick()

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    # The step that performed while the run was cancelled finished: done, not cancelled.
    assert run.steps.get(position=0).status == StepStatus.DONE
    assert run.steps.get(position=1).status == StepStatus.CANCELLED
    rows = Resource.objects.filter(run=run).exclude(kind="step")
    assert rows.count() == 2, "what the step made was not ledgered"
    assert set(rows.values_list("state", flat=True)) == {"reverted"}
    assert world == {}
    assert run.cleanup_status == CleanupStatus.COMPLETE


@pytest.mark.django_db(transaction=True)
def test_a_ticker_whose_step_was_taken_over_changes_nothing_when_it_answers():
    from django.db.models import F

    world = {}
    make = spawner(world)

    def perform_while_taken_over(**kwargs):
        answer = make(**kwargs)
        # Meanwhile another ticker took the step over (its own attempt).
        Step.objects.filter(pk=kwargs["step_id"]).update(attempts=F("attempts") + 1)
        return answer

    registry.register_action(FakeAction(perform=perform_while_taken_over, revert=Scripted(despawner(world))))
    from unittest import mock

    with mock.patch("cleanup.runner.queue_tick"):  # this test's tick is the only one
        run = start_run("slow ticker", [{"action": "test.spawn", "params": {"count": 2}}])
        tick()

    step = run.steps.get()
    assert (step.status, step.attempts) == (StepStatus.RUNNING, 2), "the late answer overwrote the newer attempt"
    assert not run.log.filter(kind="step.performed").exists()
    assert Resource.objects.filter(run=run, kind="creature").count() == 2, "what it made was not ledgered"


def test_a_module_call_never_outlives_the_claim_that_covers_it():
    from django.test import override_settings

    from cleanup import calls

    with override_settings(EVENT_CLAIM_TIMEOUT_S=30):
        assert calls.budget_under_claim(FakeAction(budget_ms=600_000)) == 29_000
        assert calls.budget_under_claim(FakeAction(budget_ms=5_000)) == 5_000
