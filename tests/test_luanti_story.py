"""The engine against real Luanti servers: runs, drift, crashes, outages, blocks asleep, two servers."""

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.test import override_settings
from django.utils import timezone

from cleanup import outages
from cleanup.models import CleanupStatus, ModuleHealth, Resource, Run, RunStatus
from cleanup.reconcile import reconcile_module
from cleanup.runner import cancel_run, start_run, tick
from cleanup.sweep import sweep
from eventsite.luanti.module import SPAWN
from tests import luanti as luanti_helpers
from tests.story import QUICK, finished, hold, refs, sweep_until

luanti_server = luanti_helpers.luanti_server

# A real server may stall now and then (see tests/test_luanti_kit.py): one rerun.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.flaky(reruns=1, reruns_delay=2)]


@pytest.fixture
def world(luanti_server):
    """The server, the module pointed at it, and its own restart reports to a mock."""
    with (
        luanti_server.settings(**QUICK),
        mock.patch("cleanup.registry.backend_restarted") as restarted,
    ):
        luanti_server.restarted = restarted
        yield luanti_server


def spawn(count, at=(0, 8, 0), entity="wolf", **more):
    return {"action": "luanti.spawn", "params": {"entity": entity, "count": count, "at": list(at), **more}}


def lease(value, name="luanti.time_speed", target="default"):
    return {"action": "core.lease", "params": {"lease": name, "target": target, "value": value}}


def setting(server, name="time_speed"):
    return server.call("setting", setting=name)["value"]


def test_a_completed_run_and_a_cancelled_one_leave_nothing_in_the_world(world):
    assert setting(world) == 72
    run = start_run("dusk", [spawn(3), lease(150), lease(4, "luanti.spawn_rate"), hold(1)])
    tick()
    made = refs(run)
    forceloads = refs(run, "forceload")
    assert len(made) == 3 and len(forceloads) == 1
    assert world.present(made + forceloads) == sorted(made + forceloads)
    assert (setting(world), setting(world, "eventsite.spawn_rate")) == (150, 4)

    time.sleep(1.1)
    tick()
    run.refresh_from_db()
    assert (run.status, run.cleanup_status) == (RunStatus.COMPLETED, CleanupStatus.COMPLETE)
    assert world.present(made + forceloads) == []
    assert (setting(world), setting(world, "eventsite.spawn_rate")) == (72, 1)

    other = start_run("raid", [spawn(2, at=(40, 8, 40)), hold()])
    tick()
    assert len(world.present(refs(other) + refs(other, "forceload"))) == 3
    cancel_run(other.pk)
    sweep_until(finished(other))
    assert world.present(refs(other) + refs(other, "forceload")) == []
    assert set(Resource.objects.exclude(kind="step").values_list("state", flat=True)) == {"reverted"}


def test_drift_by_hand_is_left_alone_and_shown(world):
    run = start_run("boost", [lease(150), hold()])
    tick()
    world.call("setting", setting="time_speed", value=99)  # a game master: /set time_speed 99
    cancel_run(run.pk)
    sweep()

    row = Resource.objects.get(run=run, kind="override")
    assert row.state == "drifted" and "99" in row.last_error
    assert setting(world) == 99


def test_what_a_crash_brings_back_is_found_through_the_boot_id_and_given_back(
    world, django_capture_on_commit_callbacks
):
    run = start_run("night", [spawn(3), hold(1)])
    tick()
    made = refs(run)
    world.restart()  # a clean stop: the map is saved with the three wolves in it
    later = timezone.now() + timedelta(minutes=2)  # each tick watches too: be past its interval
    assert outages.watch(now=later) == 1  # the engine learns the new boot id
    time.sleep(1.1)
    tick()
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE and world.present(made) == []

    world.kill()  # kill -9 after the wolves were given back, before any save
    world.start()
    assert world.present(made) == made  # the map brought them back

    with django_capture_on_commit_callbacks(execute=True):
        assert outages.watch(now=later + timedelta(minutes=2)) == 1  # no run active, no call made
    health = ModuleHealth.objects.get(module="luanti", backend="")
    assert health.boot_id == world.boot_id
    back = Resource.objects.filter(run=run, kind="creature", resurrected_from__isnull=False)
    assert sorted(back.values_list("ref", flat=True)) == made
    sweep_until(finished(run))
    assert world.present(made) == []
    assert not world.restarted.called or world.restarted.call_args.args == ("luanti", "")


def test_a_server_stopped_during_cleanup_spends_no_attempt_and_is_given_back_after_it_returns(world):
    run = start_run("storm", [spawn(2), lease(150), hold()])
    tick()
    made = refs(run)
    world.stop()  # the heartbeat goes with it: every call answers unavailable at once
    cancel_run(run.pk)
    started = time.monotonic()
    sweep()
    assert time.monotonic() - started < 5
    health = ModuleHealth.objects.get(module="luanti", backend="")
    assert health.state == "down"
    rows = Resource.objects.filter(run=run).exclude(kind="step")
    assert {(r.state, r.revert_attempts) for r in rows} <= {("live", 0), ("failed", 0)}, [
        (r.ref, r.state, r.revert_attempts, r.last_error) for r in rows
    ]

    world.start()  # time_speed is back at its configured value: the lease is forgotten
    time.sleep(1.1)  # the probe is due
    sweep_until(finished(run))
    assert world.present(made) == []
    assert setting(world) == 72
    assert Run.objects.get(pk=run.pk).cleanup_status == CleanupStatus.COMPLETE


def test_creatures_in_a_block_that_cannot_be_woken_are_unknown_never_gone():
    with (
        luanti_helpers.running_server(max_forceloaded_blocks=1) as server,
        server.settings(**QUICK),
        mock.patch("cleanup.registry.backend_restarted"),
    ):
        asleep = start_run("asleep", [spawn(2), hold()])
        tick()
        made, (forceload,) = refs(asleep), refs(asleep, "forceload")
        server.call("despawn", refs=[forceload])  # its block is let go behind the engine's back
        awake = start_run("awake", [spawn(1, at=(100, 8, 100)), hold()])  # and the only slot is taken
        tick()
        time.sleep(3)  # the block leaves the active blocks

        resources = [{"kind": "creature", "ref": ref, "payload": {}, "member_key": ""} for ref in made]
        assert SPAWN.reconcile(run_id=asleep.pk, resources=resources) == {
            "ok": True,
            "in_force": [],
            "unknown": made,
        }
        reconcile_module("luanti")
        assert refs(asleep, state="live") == made  # not orphaned

        cancel_run(awake.pk)
        sweep_until(finished(awake))  # the slot comes free
        assert SPAWN.reconcile(run_id=asleep.pk, resources=resources) == {"ok": True, "in_force": made}


def test_two_servers_one_stopped_the_others_rows_are_given_back_meanwhile():
    with (
        luanti_helpers.running_server("north") as north,
        luanti_helpers.running_server("south") as south,
        override_settings(
            LUANTI_WORLDS=f"{north.setting()},{south.setting()}",
            LUANTI_HEARTBEAT_STALE_S=luanti_helpers.STALE_S,
            **QUICK,
        ),
        mock.patch("cleanup.registry.backend_restarted"),
    ):
        up = start_run("south", [spawn(2, shard="south"), lease(150, target="south"), hold()])
        down = start_run("north", [spawn(2, shard="north"), lease(150, target="north"), hold()])
        tick()
        assert {r.backend for r in Resource.objects.exclude(kind="step")} == {"north", "south"}
        north.stop()
        cancel_run(up.pk)
        cancel_run(down.pk)

        sweep_until(finished(up))
        assert south.present(refs(up)) == [] and setting(south) == 72
        assert ModuleHealth.objects.get(module="luanti", backend="north").state == "down"
        assert ModuleHealth.objects.get(module="luanti", backend="south").state == "up"
        waiting = Resource.objects.filter(run=down).exclude(kind="step")
        assert {r.revert_attempts for r in waiting} == {0}

        north.start()
        time.sleep(1.1)
        sweep_until(finished(down))
        assert north.present(refs(down)) == []
