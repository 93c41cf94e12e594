"""The engine against a fleet of two real sandbox shards, north and south: one shard's outage
holds only its own work, one shard's restart reconciles only its own rows, an idle restart
is found through health()'s boot id, and every row that was not given back says why.

Time is moved with time-machine rather than waited for.
"""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from cleanup import outages
from cleanup.models import CleanupStatus, ModuleHealth, Resource, Run, Step
from cleanup.runner import cancel_run, start_run, tick
from cleanup.sweep import sweep
from eventsite.sandbox import module as sandbox
from tests import shard as shard_helpers

shard_process = shard_helpers.shard_process
shard_fleet = shard_helpers.shard_fleet

pytestmark = pytest.mark.django_db

SETTINGS = {
    "EVENT_REVERT_BACKOFF_S": 0,
    "EVENT_STEP_BACKOFF_S": 0,
    "EVENT_OUTAGE_AFTER": 3,
    "EVENT_OUTAGE_PROBE_S": 15,
    "EVENT_OUTAGE_SPREAD_S": 5,
    "SANDBOX_SHARD_TIMEOUT_MS": 1000,
}


@pytest.fixture
def fleet(shard_fleet):
    sandbox.fleet.forget()
    with shard_fleet.settings(**SETTINGS):
        yield shard_fleet
    sandbox.fleet.forget()


def spawn(shard, count=2, creature="orc"):
    return {
        "action": "sandbox.spawn",
        "params": {"creature": creature, "count": count, "at": f"{shard}-gate", "shard": shard},
    }


def hold(seconds=3600):
    return {"action": "core.wait", "params": {"seconds": seconds}}


def boost(target, value):
    return {"action": "core.lease", "params": {"lease": "sandbox.spawner_rate", "target": target, "value": value}}


def creatures(process):
    return [c for c in process.get("/creatures").json()["creatures"] if c["key"]]


def rows(run, **filters):
    return Resource.objects.filter(run=run, kind="creature", **filters)


def states(run):
    return set(rows(run).values_list("state", flat=True))


def test_one_shard_down_holds_only_its_own_rows_and_steps_and_spends_no_attempt(fleet):
    north, south = fleet["north"], fleet["south"]
    with time_machine.travel(timezone.now(), tick=False) as clock:
        northern = [start_run(f"north raid {i}", [spawn("north"), hold()]) for i in range(3)]
        southern = start_run("south raid", [spawn("south"), hold()])
        tick()
        assert len(creatures(north)) == 6 and len(creatures(south)) == 2

        north.post("/faults", json={"down": "refuse"})
        late_north = start_run("north raid, started during the outage", [spawn("north"), hold()])
        late_south = start_run("south raid, started during the outage", [spawn("south", 3), hold()])
        for run in [*northern, southern]:
            cancel_run(run.pk)
        sweep(by="test")  # three northern groups blame north in one pass: it is marked down
        tick()

        assert outages.down_backends() == {("sandbox", "north")}
        for run in northern:
            assert {(r.state, r.revert_attempts) for r in rows(run)} <= {("failed", 0), ("live", 0)}
            assert Run.objects.get(pk=run.pk).cleanup_status == CleanupStatus.PENDING
        # The other shard's run is given back meanwhile, and its new run performs.
        assert states(southern) == {"reverted"}
        assert Run.objects.get(pk=southern.pk).cleanup_status == CleanupStatus.COMPLETE
        assert rows(late_south).count() == 3
        assert len(creatures(south)) == 3
        waiting = Step.objects.get(run=late_north, position=0)
        assert waiting.status == "pending" and waiting.attempts == 0
        assert waiting.waiting_since == ModuleHealth.objects.get(module="sandbox", backend="north").down_since
        assert not rows(late_north).exists()

        north.delete("/faults")
        clock.shift(timedelta(seconds=16))
        sweep(by="test")  # the probe (health) finds north back; its rows resume by group
        clock.shift(timedelta(seconds=6))
        sweep(by="test")
        tick()

    for run in northern:
        assert states(run) == {"reverted"}
        assert max(rows(run).values_list("revert_attempts", flat=True)) == 1
        assert Run.objects.get(pk=run.pk).cleanup_status == CleanupStatus.COMPLETE
    assert rows(late_north).count() == 2
    assert ModuleHealth.objects.get(module="sandbox", backend="north").state == "up"
    assert outages.down_backends() == set()


def test_a_restart_of_one_shard_reconciles_only_its_rows(fleet, django_capture_on_commit_callbacks):
    north, south = fleet["north"], fleet["south"]
    raids = {shard: start_run(f"{shard} raid", [spawn(shard, 3), hold()]) for shard in ("north", "south")}
    tick()
    for shard, run in raids.items():
        fleet[shard].post("/save")
        cancel_run(run.pk)
    sweep(by="test")
    assert creatures(north) == creatures(south) == []

    for shard in ("north", "south"):
        fleet[shard].post("/restart", json={"mode": "rollback"})
    assert len(creatures(north)) == len(creatures(south)) == 3, "the rollbacks did not bring them back"

    # The module's next call to north sees its new boot id and reports north alone.
    with django_capture_on_commit_callbacks(execute=True):
        assert sandbox.SPAWN.health(backend="north")["ok"] is True

    assert creatures(north) == [], "north's resurrected creatures were not given back"
    resurrected = rows(raids["north"], resurrected_from__isnull=False)
    assert resurrected.count() == 3 and set(resurrected.values_list("state", flat=True)) == {"reverted"}
    assert Run.objects.get(pk=raids["north"].pk).cleanup_status == CleanupStatus.COMPLETE
    # South restarted too, but nobody said so: its rows and creatures are as they were.
    assert len(creatures(south)) == 3
    assert not rows(raids["south"], resurrected_from__isnull=False).exists()
    assert states(raids["south"]) == {"reverted"}


def test_an_idle_restart_is_found_through_healths_boot_id_and_given_back(fleet, django_capture_on_commit_callbacks):
    north = fleet["north"]
    run = start_run("north raid", [spawn("north", 4), boost("north:orc-camp", 3.0), hold()])
    tick()
    north.post("/save")  # the shard saves while the creatures and the boost are in force
    cancel_run(run.pk)
    sweep(by="test")
    assert creatures(north) == [] and north.get("/spawners/orc-camp").json()["rate"] == 1.0
    # The tick watched the backends holding something: north (south holds nothing).
    health = ModuleHealth.objects.get(module="sandbox", backend="north")
    assert health.boot_id == north.boot_id and health.watched_at is not None
    assert not ModuleHealth.objects.filter(module="sandbox", backend="south").exclude(watched_at=None).exists()

    north.post("/restart", json={"mode": "rollback"})
    assert len(creatures(north)) == 4 and north.get("/spawners/orc-camp").json()["rate"] == 3.0
    sandbox.fleet.forget()  # no worker of the module has seen north: only the engine's watch can tell

    with time_machine.travel(timezone.now(), tick=False) as clock:
        assert outages.watch() == 0, "asked again before EVENT_BACKEND_WATCH_S"
        clock.shift(timedelta(seconds=61))
        with django_capture_on_commit_callbacks(execute=True):
            assert outages.watch() == 1

    health.refresh_from_db()
    assert health.boot_id == north.get("/health").json()["boot_id"] != north.boot_id
    assert creatures(north) == [], "the resurrected creatures are still on the shard"
    assert north.get("/spawners/orc-camp").json()["rate"] == 1.0
    again = Resource.objects.filter(run=run, resurrected_from__isnull=False)
    assert again.count() == 5 and set(again.values_list("state", flat=True)) == {"reverted"}
    assert set(again.values_list("backend", flat=True)) == {"north"}
    assert Run.objects.get(pk=run.pk).cleanup_status == CleanupStatus.COMPLETE


def test_each_row_the_shard_refused_says_why(fleet):
    north, south = fleet["north"], fleet["south"]
    hunts = {shard: start_run(f"{shard} hunt", [spawn(shard, 3, "wolf"), hold()]) for shard in ("north", "south")}
    tick()
    north.post("/faults", json={"stuck": ["wolf"]})
    for run in hunts.values():
        cancel_run(run.pk)
    sweep(by="test")

    refused = list(rows(hunts["north"]))
    assert {(r.state, r.retryable, r.backend) for r in refused} == {("failed", True, "north")}
    for row in refused:
        assert row.last_error == f"refused: the wolf is in combat (sandbox.spawn could not give back {row.ref})"
    assert states(hunts["south"]) == {"reverted"} and creatures(south) == []
    assert outages.down_backends() == set(), "a refusal is about the row, not the shard"
