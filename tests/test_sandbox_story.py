"""The engine against a real sandbox shard process: the story, faults, stacking, restarts."""

import itertools
from datetime import timedelta
from unittest import mock

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup.models import CleanupStatus, Resource, Run, RunStatus
from cleanup.reconcile import reconcile_module
from cleanup.runner import cancel_run, start_run, tick
from cleanup.sweep import sweep
from eventsite.sandbox import module as sandbox
from tests import shard as shard_helpers
from tests.fakes import make_lease_row, make_run

shard_process = shard_helpers.shard_process

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(shard_process):
    """The shard, with the module pointed at it and restarts reported to a mock."""
    with (
        override_settings(SANDBOX_SHARD_URL=shard_process.url, EVENT_REVERT_BACKOFF_S=0, EVENT_STEP_BACKOFF_S=0),
        mock.patch("cleanup.registry.backend_restarted") as restarted,
    ):
        shard_process.restarted = restarted
        yield shard_process


def creatures(world, key=None):
    params = {"key": key} if key else {}
    return [c for c in world.get("/creatures", params=params).json()["creatures"] if c["key"]]


def rate(world, spawner="orc-camp"):
    return world.get(f"/spawners/{spawner}").json()["rate"]


def spawn(count, creature="orc"):
    return {"action": "sandbox.spawn", "params": {"creature": creature, "count": count, "at": "north-gate"}}


def boost(value, target="orc-camp"):
    return {"action": "core.lease", "params": {"lease": "sandbox.spawner_rate", "target": target, "value": value}}


def hold(seconds=3600):
    return {"action": "core.wait", "params": {"seconds": seconds}}


def test_a_runs_whole_story_before_during_and_after(world):
    assert (creatures(world), rate(world)) == ([], 1.0)
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        run = start_run("invasion", [spawn(5), boost(4.0), hold(60), spawn(2, "troll")])
        tick()
        during = creatures(world)
        assert (len(during), {c["kind"] for c in during}, rate(world)) == (5, {"orc"}, 4.0)
        clock.shift(timedelta(seconds=61))
        tick()

    run.refresh_from_db()
    assert (run.status, run.cleanup_status) == (RunStatus.COMPLETED, CleanupStatus.COMPLETE)
    assert (creatures(world), rate(world)) == ([], 1.0)
    rows = Resource.objects.filter(run=run).exclude(kind="step")
    assert rows.count() == 5 + 2 + 1 and set(rows.values_list("state", flat=True)) == {"reverted"}


def test_latency_past_the_budget_reads_as_retry(world, monkeypatch):
    run = start_run("slow", [spawn(2), hold()])
    tick()
    cancel_run(run.pk)
    world.post("/faults", json={"latency_ms": 800})
    monkeypatch.setattr(sandbox.SPAWN, "budget_ms", 200)

    sweep()

    rows = Resource.objects.filter(run=run, kind="creature")
    assert {(r.state, r.retryable) for r in rows} == {("failed", True)}
    assert rows[0].last_error == "sandbox.spawn did not answer within 200 ms"
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.PENDING


def test_a_shard_that_is_down_then_back_recovers_on_the_next_attempt(world):
    run = start_run("outage", [spawn(3), hold()])
    tick()
    cancel_run(run.pk)
    world.post("/faults", json={"down": "refuse"})
    sweep()
    assert set(Resource.objects.filter(run=run).values_list("state", "revert_attempts")) == {("failed", 1)}

    world.delete("/faults")
    assert len(creatures(world)) == 3
    sweep()

    assert set(Resource.objects.filter(run=run).values_list("state", "revert_attempts")) == {("reverted", 2)}
    assert creatures(world) == []


def test_a_4xx_from_the_shard_is_terminal_with_its_message(world):
    run = make_run()
    row = make_lease_row(
        run, lease_id="sandbox.spawner_rate", target="no-such-camp", baseline=1.0, applied=3.0, module="sandbox"
    )
    sweep()
    sweep()
    row.refresh_from_db()
    assert (row.state, row.retryable, row.revert_attempts) == ("failed", False, 1)
    assert "no-such-camp" in row.last_error


def test_a_refused_perform_aborts_the_run_at_once(world):
    world.post("/spawn", json={"key": "k", "creature": "orc", "count": 1, "at": "x"})
    run = start_run("clash", [spawn(1)])
    run.steps.update(idempotency_key="k")  # the shard knows this key with other params: 409
    tick()
    run.refresh_from_db()
    assert run.status == RunStatus.ABORTED
    assert run.steps.get().attempts == 1


def test_drift_ends_drifted_with_the_current_value(world):
    run = start_run("boost", [boost(4.0), hold()])
    tick()
    world.post("/drift", json={"spawner": "orc-camp", "rate": 7.0})
    cancel_run(run.pk)

    sweep()
    sweep()

    row = Resource.objects.get(run=run, kind="override")
    assert row.state == "drifted" and "7.0" in row.last_error
    assert run.log.get(kind="cleanup.failed").detail["current"] == 7.0
    assert rate(world) == 7.0, "somebody else's value was overwritten"


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_three_runs_boosting_one_spawner_leave_the_original_rate_in_any_order(world, order):
    runs = [start_run(f"boost {v}", [boost(v), hold()]) for v in (2.0, 3.0, 5.0)]
    tick()
    assert rate(world) == 5.0

    for index in order:
        cancel_run(runs[index].pk)
        sweep()
        still_open = [i for i in range(3) if Run.objects.get(pk=runs[i].pk).status == RunStatus.RUNNING]
        assert rate(world) == ((2.0, 3.0, 5.0)[max(still_open)] if still_open else 1.0)

    assert rate(world) == 1.0
    assert set(Resource.objects.filter(kind="override").values_list("state", flat=True)) == {"reverted"}


def test_a_rollback_orphans_what_was_spawned_after_the_save(world):
    run = start_run("raid", [spawn(3), hold()])
    tick()
    world.post("/restart", json={"mode": "rollback"})

    summary = reconcile_module("sandbox", restarted=True)

    assert summary.orphaned == 3
    assert set(Resource.objects.filter(run=run, kind="creature").values_list("state", flat=True)) == {"orphaned"}
    assert run.log.filter(kind="resource.orphaned").count() == 3
    world.restarted.assert_called_with("sandbox", "")


def test_a_rollback_brings_back_what_was_despawned_after_the_save_and_it_is_given_back(world):
    run = start_run("raid", [spawn(3), hold()])
    tick()
    world.post("/save")
    cancel_run(run.pk)
    sweep()
    assert set(Resource.objects.filter(run=run, kind="creature").values_list("state", flat=True)) == {"reverted"}
    assert creatures(world) == []

    world.post("/restart", json={"mode": "rollback"})
    assert len(creatures(world)) == 3, "the rollback did not bring them back"
    summary = reconcile_module("sandbox", restarted=True)
    assert summary.resurrected == 3
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.PENDING

    sweep()

    assert creatures(world) == []
    assert run.log.filter(kind="resource.resurrected").count() == 3
    assert set(
        Resource.objects.filter(run=run, kind="creature", resurrected_from__isnull=False).values_list(
            "state", flat=True
        )
    ) == {"reverted"}


def test_a_wipe_restart_orphans_every_event_spawn(world):
    run = start_run("raid", [spawn(4), hold()])
    tick()
    world.post("/save")
    world.post("/restart", json={"mode": "wipe"})

    assert reconcile_module("sandbox", restarted=True).orphaned == 4
    assert set(Resource.objects.filter(run=run, kind="creature").values_list("state", flat=True)) == {"orphaned"}


def test_a_rollback_that_brings_a_boost_back_has_it_restored_again(world):
    run = start_run("festival", [boost(4.0), hold()])
    tick()
    world.post("/save")  # the shard saves while the boost holds
    cancel_run(run.pk)
    sweep()
    assert rate(world) == 1.0

    world.post("/restart", json={"mode": "rollback"})
    assert rate(world) == 4.0, "the rollback did not bring the boost back"
    assert reconcile_module("sandbox", restarted=True).resurrected == 1
    sweep()

    assert rate(world) == 1.0
    assert run.log.get(kind="resource.resurrected").detail["resource"] == "override:sandbox.spawner_rate#orc-camp"
    # Asked again, with the boost given back, nothing more comes back.
    assert reconcile_module("sandbox", restarted=True).resurrected == 0
