"""The engine against two real OpenArena servers: a night of runs, drift, a crash, a freeze."""

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from cleanup import outages
from cleanup.models import ModuleHealth, Resource, RunStatus
from cleanup.runner import cancel_run, start_run, tick
from cleanup.sweep import sweep
from tests import arena as arena_helpers
from tests.story import QUICK, finished, hold, refs, sweep_until

arena_fleet = arena_helpers.arena_fleet  # two servers, shared by this file's tests
arena = arena_helpers.arena

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

SWEEP_S = 60.0  # two servers at five frames a second: give them time


@pytest.fixture
def night(arena):
    """Both servers, the module pointed at them, its own restart reports to a mock."""
    with arena.settings(**QUICK), mock.patch("cleanup.registry.backend_restarted") as restarted:
        arena.restarted = restarted
        yield arena


def bots(count, shard):
    return {"action": "arena.bots", "params": {"count": count, "skill": 1, "shard": shard}}


def gravity(value, shard):
    return {"action": "core.lease", "params": {"lease": "arena.cvar", "target": f"{shard}:g_gravity", "value": value}}


def test_a_run_on_both_servers_is_given_back_and_a_cancelled_one_too(night):
    north, south = night["north"], night["south"]
    run = start_run("dusk", [bots(2, "north"), bots(1, "south"), gravity(300, "north"), hold(1)])
    tick()
    made = refs(run, "bot")
    assert len(made) == 3
    assert north.bots() == sorted(r for r in made if r in north.bots()) and len(north.bots()) == 2
    assert len(south.bots()) == 1
    assert north.cvar("g_gravity") == "300"

    time.sleep(1.1)
    tick()
    sweep_until(finished(run), SWEEP_S)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert north.bots() == [] and south.bots() == []
    assert north.cvar("g_gravity") == "800"

    other = start_run("raid", [bots(2, "south"), gravity(250, "south"), hold()])
    tick()
    assert len(south.bots()) == 2 and south.cvar("g_gravity") == "250"
    cancel_run(other.pk)
    sweep_until(finished(other), SWEEP_S)
    assert south.bots() == [] and south.cvar("g_gravity") == "800"
    assert set(Resource.objects.exclude(kind="step").values_list("state", flat=True)) == {"reverted"}


def test_drift_by_hand_is_left_alone_and_shown(night):
    north = night["north"]
    run = start_run("boost", [gravity(300, "north"), hold()])
    tick()
    north.rcon("set g_gravity 500")  # an admin, by hand
    cancel_run(run.pk)
    sweep()
    row = Resource.objects.get(run=run, kind="override")
    assert row.state == "drifted" and "500" in row.last_error
    assert north.cvar("g_gravity") == "500"
    north.rcon("set g_gravity 800")


def test_a_server_killed_mid_event_and_restarted_has_its_rows_orphaned(night, django_capture_on_commit_callbacks):
    north, south = night["north"], night["south"]
    run = start_run("night", [bots(2, "north"), bots(1, "south"), gravity(300, "north"), hold()])
    tick()
    later = timezone.now() + timedelta(minutes=2)  # past the watch's interval
    outages.watch(now=later)  # the engine learns each server's boot id
    before = ModuleHealth.objects.get(module="arena", backend="north").boot_id
    assert before

    north.kill()  # kill -9: its bots and its cvars go with the process
    north.start()
    with django_capture_on_commit_callbacks(execute=True):
        outages.watch(now=later + timedelta(minutes=2))
    assert ModuleHealth.objects.get(module="arena", backend="north").boot_id != before

    rows = Resource.objects.filter(run=run).exclude(kind="step")
    states = {(r.backend, r.kind, r.state) for r in rows}
    assert states == {("north", "bot", "orphaned"), ("north", "override", "orphaned"), ("south", "bot", "live")}, [
        (r.backend, r.ref, r.state, r.last_error) for r in rows
    ]
    cancel_run(run.pk)
    sweep_until(finished(run), SWEEP_S)
    assert south.bots() == [] and north.bots() == []


def test_a_server_frozen_a_minute_spends_no_attempt_while_the_other_is_given_back(night):
    north, south = night["north"], night["south"]
    up = start_run("south", [bots(2, "south"), gravity(300, "south"), hold()])
    down = start_run("north", [bots(2, "north"), gravity(300, "north"), hold()])
    tick()
    assert len(north.bots()) == 2 and len(south.bots()) == 2

    north.pause()  # SIGSTOP: every request to it goes unanswered
    frozen = time.monotonic()
    try:
        cancel_run(up.pk)
        cancel_run(down.pk)
        sweep_until(finished(up), SWEEP_S)
        assert south.bots() == [] and south.cvar("g_gravity") == "800"
        while time.monotonic() - frozen < 60:
            sweep()
            health = ModuleHealth.objects.get(module="arena", backend="north")
            assert health.state == "down"
            waiting = Resource.objects.filter(run=down).exclude(kind="step")
            assert {r.revert_attempts for r in waiting} == {0}, [(r.ref, r.state, r.revert_attempts) for r in waiting]
            time.sleep(5)
    finally:
        north.resume()
    time.sleep(1.1)  # the probe is due
    sweep_until(finished(down), SWEEP_S)
    assert north.bots() == [] and north.cvar("g_gravity") == "800"
