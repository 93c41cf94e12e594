"""Rules 2, 6, 7 and 8: what the sweep touches, how much, and who may lower a counter."""

import pytest
from django.test import override_settings

from cleanup import registry
from cleanup.models import CleanupStatus, Resource, RunStatus
from cleanup.sweep import CleanupRefused, cleanup_run, sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db

OK = {"ok": True, "failed": []}
DOWN = {"ok": False, "error": "shard is down"}


def test_a_run_in_flight_is_never_touched():
    revert = Scripted(OK)
    registry.register_action(FakeAction(revert=revert))
    run = make_run(status=RunStatus.RUNNING)
    make_rows(make_step(run), ["orc-1"])

    assert sweep().runs == 0
    with pytest.raises(CleanupRefused, match="still running"):
        cleanup_run(run)

    assert revert.calls == []
    assert set(states(run).values()) == {"live"}


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.ABORTED])
def test_every_terminal_status_is_cleaned(status):
    registry.register_action(FakeAction(revert=Scripted(OK)))
    run = make_run(status=status)
    make_rows(make_step(run), ["orc-1"])
    sweep()
    assert set(states(run).values()) == {"reverted"}


@override_settings(EVENT_CLEANUP_RUN_BATCH=2)
def test_one_leg_cleans_at_most_the_run_batch():
    registry.register_action(FakeAction(revert=Scripted(OK)))
    runs = [make_run() for _ in range(5)]
    for run in runs:
        make_rows(make_step(run), ["orc-1"])

    assert sweep().runs == 2
    assert sweep().runs == 2
    assert sweep().runs == 1
    assert not Resource.objects.exclude(state="reverted").exists()


@override_settings(EVENT_CLEANUP_GROUPS_PER_RUN=3)
def test_one_pass_works_at_most_the_groups_per_run():
    revert = Scripted(OK)
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    for i in range(7):
        make_rows(make_step(run), [f"orc-{i}"])

    cleanup_run(run)
    assert len(revert.calls) == 3
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.PENDING
    cleanup_run(run)
    cleanup_run(run)
    assert len(revert.calls) == 7
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE


@override_settings(EVENT_REVERT_BACKOFF_S=0, EVENT_REVERT_MAX_ATTEMPTS=2)
def test_only_a_persons_reset_lowers_the_counters():
    revert = Scripted(DOWN, DOWN, OK)
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    for _ in range(4):
        sweep()
    row = Resource.objects.get()
    assert (row.revert_attempts, row.state) == (2, "failed")

    summary = cleanup_run(run, reset=True, actor="alice")

    assert summary.reverted == 1
    row.refresh_from_db()
    assert (row.state, row.revert_attempts) == ("reverted", 1)
    retry = run.log.get(kind="cleanup.retry")
    assert retry.detail == {"resources": 1, "by": "alice"}
    assert run.log.filter(kind="cleanup.swept").last().detail["by"] == "alice"


@override_settings(EVENT_REVERT_BACKOFF_S=0)
def test_a_persons_reset_also_retries_drifted_and_terminal_rows():
    revert = Scripted({"ok": False, "error": "no", "retry": False}, OK)
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    sweep()
    assert Resource.objects.get().retryable is False
    cleanup_run(run, reset=True, actor="bob")
    assert Resource.objects.get().state == "reverted"


def test_rows_of_a_run_cancelled_without_cleanup_wait_for_a_person():
    revert = Scripted(OK)
    registry.register_action(FakeAction(revert=revert))
    run = make_run(status=RunStatus.CANCELLED, auto_cleanup=False)
    make_rows(make_step(run), ["orc-1"])

    assert sweep().runs == 0
    assert revert.calls == []

    cleanup_run(run, reset=True, actor="carol")
    assert set(states(run).values()) == {"reverted"}
    run.refresh_from_db()
    assert run.auto_cleanup is True
    assert run.cleanup_status == CleanupStatus.COMPLETE


def test_a_row_written_after_the_run_ended_is_still_given_back():
    revert = Scripted(OK)
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    step = make_step(run)
    make_rows(step, ["orc-1"])
    sweep()
    make_rows(step, ["orc-late"], placeholder=False)

    sweep()

    assert states(run)["orc-late"] == "reverted"
    assert [r["ref"] for r in revert.calls[-1]["resources"]] == ["orc-late"]
