"""The dead-man's switch against a real sandbox shard process (rule 34).

The shard gives back by itself what a run took when the core stops renewing its session,
with no engine process running; when ticks resume, the core records it without calling
the shard for those rows; a core that renews on time never sets the switch off; a renewal
that fails counts towards the backend's outage.
"""

import re
import time
import uuid
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from cleanup import deadman, outages
from cleanup.alerts import notice_modules
from cleanup.models import (
    Attempt,
    CleanupStatus,
    DeadmanSwitch,
    ModuleEvent,
    ModuleHealth,
    Resource,
    Run,
    RunLog,
    RunStatus,
    Step,
)
from cleanup.reconcile import reconcile_module
from cleanup.runner import keep_alive, keep_alive_loop, start_run, tick
from eventsite.sandbox import module as sandbox
from tests import shard as shard_helpers
from tests.healthy_core import RUN_S
from tests.healthy_core import TTL_S as HEALTHY_TTL_S
from tests.healthy_core import wait_until as wait_for
from tests.story import wait_until

shard_process = shard_helpers.shard_process

pytestmark = pytest.mark.django_db

TTL_S = 3


@pytest.fixture
def world(shard_process):
    sandbox.fleet.forget()
    with override_settings(
        SANDBOX_SHARD_URL=shard_process.url,
        EVENT_DEADMAN_TTL_S=TTL_S,
        EVENT_REVERT_BACKOFF_S=0,
        EVENT_STEP_BACKOFF_S=0,
        SANDBOX_SHARD_TIMEOUT_MS=1000,
    ):
        yield shard_process
    sandbox.fleet.forget()


def creatures(world):
    return [c for c in world.get("/creatures").json()["creatures"] if c["key"]]


def rate(world, spawner="orc-camp"):
    return world.get(f"/spawners/{spawner}").json()["rate"]


def raid(name="raid", count=3, value=5.0):
    return start_run(
        name,
        [
            {"action": "sandbox.spawn", "params": {"creature": "orc", "count": count, "at": "north-gate"}},
            {"action": "core.lease", "params": {"lease": "sandbox.spawner_rate", "target": "orc-camp", "value": value}},
            {"action": "core.wait", "params": {"seconds": 3600}},
        ],
    )


def requests(world, pattern):
    """How many requests the shard logged whose line matches ``pattern``."""
    return len(re.findall(pattern, world.stderr()))


def test_the_shard_gives_back_a_runs_creatures_and_lease_within_ttl_and_two_seconds_with_no_engine_running(world):
    run = raid()
    tick()
    assert len(creatures(world)) == 3 and rate(world) == 5.0
    switch = DeadmanSwitch.objects.get(module="sandbox", backend="")
    assert switch.armed and switch.ttl_s == TTL_S
    [session] = world.switch()
    assert session["session"] == str(switch.session)
    assert session["holds"] == {"keys": 1, "creatures": 3, "spawners": ["orc-camp"]}
    last_renewal = time.monotonic()  # the tick renewed before it performed: nothing renews now

    # No engine process runs: the shard alone gives back.
    assert wait_until(lambda: not creatures(world) and rate(world) == 1.0, TTL_S + 2)
    assert time.monotonic() - last_renewal <= TTL_S + 2
    [lapse] = world.lapses()
    assert len(lapse["given_back"]["creatures"]) == 3
    assert lapse["given_back"]["spawners"] == {"orc-camp": 1.0}
    assert lapse["kept"] == {"creatures": {}, "spawners": {}}
    given_back_calls = requests(world, r"POST /despawn|PUT /spawners|/revoke")

    # The core comes back: its first renewal hears the lapse and records it.
    tick()
    tick()

    run.refresh_from_db()
    assert run.status == RunStatus.ABORTED
    assert run.cleanup_status == CleanupStatus.COMPLETE
    taken = Resource.objects.filter(run=run).exclude(kind="step")
    assert set(taken.values_list("state", flat=True)) == {"reverted"}
    assert taken.count() == 4
    reason = taken.first().last_error
    assert re.fullmatch(r"given back by sandbox's own switch at \d\d:\d\d: no word from the core for \d+ s", reason)
    assert set(Attempt.objects.filter(resource__run=run).values_list("error", flat=True)) == {reason}
    assert not Resource.objects.filter(run=run, state__in=["live", "failed", "reverting"]).exists()
    # Its later step was not performed, and its log says why, once.
    assert Step.objects.get(run=run, position=2).status == "cancelled"
    [lapsed] = RunLog.objects.filter(run=run, kind="backend.lapsed")
    assert lapsed.detail["reason"] == reason and len(lapsed.detail["given_back"]) == 4
    assert RunLog.objects.get(run=run, kind="run.aborted").detail["error"] == reason
    # The shard was called for none of those rows again.
    assert requests(world, r"POST /despawn|PUT /spawners|/revoke") == given_back_calls
    # A new session replaced the lapsed one, and is armed.
    switch.refresh_from_db()
    assert switch.lapses == 1 and switch.armed and str(switch.session) != session["session"]
    assert switch.last_lapse_reason == reason and switch.last_lapse_given_back == 4


def test_staff_are_told_once_per_lapse(world):
    raid()
    tick()
    assert wait_until(lambda: world.lapses(), TTL_S + 2)
    tick()
    tick()
    keep_alive()
    [event] = ModuleEvent.objects.filter(kind="module.lapsed")
    assert event.detail["given_back"] == 4
    assert notice_modules() == 1
    assert notice_modules() == 0


def test_a_creature_the_switch_could_not_give_back_stays_failed_with_its_reason(world):
    run = raid(value=4.0)
    tick()
    world.post("/faults", json={"stuck": ["orc"]})
    assert wait_until(lambda: world.lapses(), TTL_S + 2)
    tick()
    run.refresh_from_db()
    assert run.status == RunStatus.ABORTED
    orcs = Resource.objects.filter(run=run, kind="creature")
    assert set(orcs.values_list("state", flat=True)) == {"failed"}
    # The switch's reason is in each row's history; the sweep may try it again itself.
    kept = Attempt.objects.filter(resource__in=orcs, by="backend switch", outcome="failed")
    assert kept.count() == 3
    assert all("own switch" in e and "kept: the orc is in combat" in e for e in kept.values_list("error", flat=True))
    assert Resource.objects.get(run=run, kind="override").state == "reverted"
    assert rate(world) == 1.0


def test_a_core_renewing_on_time_never_sets_the_switch_off(world):
    run = raid()
    tick()
    # Renewing as each session falls due, for more than three ttls.
    assert keep_alive_loop(3 * TTL_S + 1) is True
    assert world.lapses() == []
    assert len(creatures(world)) == 3 and rate(world) == 5.0
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert DeadmanSwitch.objects.get().lapses == 0


def test_a_renewal_by_the_tick_while_the_loop_sleeps_does_not_stop_the_loop(world):
    """The tick renews what is due too: a loop that stopped on hearing it would leave the
    sessions to the minute schedules, a minute apart, and a ttl of 30 s would lapse."""
    raid()
    tick()

    def sleep_then_the_tick_renews(seconds):
        time.sleep(seconds)
        assert keep_alive(), "the session was not due when the loop woke"

    assert keep_alive_loop(3 * TTL_S + 1, sleep=sleep_then_the_tick_renews) is True
    assert world.lapses() == [] and len(creatures(world)) == 3
    assert DeadmanSwitch.objects.get().lapses == 0


def test_one_loop_holds_the_sessions_and_a_second_stops_at_once_until_the_first_is_gone(world):
    raid()
    tick()
    first, second = uuid.uuid4(), uuid.uuid4()
    assert deadman.hold_loop(first, timezone.now() + timedelta(seconds=60))
    started = time.monotonic()
    assert keep_alive_loop(3 * TTL_S, token=second) is False
    assert time.monotonic() - started < TTL_S / 3
    # The first loop goes on with its own token.
    assert keep_alive_loop(1, token=first) is True
    assert DeadmanSwitch.objects.get().loop_token == first
    # A first loop that died holds the sessions only until its hold runs out.
    DeadmanSwitch.objects.update(loop_until=timezone.now() - timedelta(seconds=1))
    assert keep_alive_loop(1, token=second) is True
    assert DeadmanSwitch.objects.get().loop_token == second


def test_the_keepalive_task_goes_on_with_its_loops_token_and_leaves_a_held_loop_alone(world, monkeypatch):
    from cleanup import tasks

    queued = []
    monkeypatch.setattr(tasks, "KEEPALIVE_LOOP_S", 1)
    monkeypatch.setattr(tasks, "queue_keepalive", lambda loop=None: queued.append(loop))
    monkeypatch.setattr("cleanup.wakeup.clock_runs", lambda: True)
    raid()
    tick()
    with override_settings(EVENT_DEADMAN_TTL_S=30):
        tasks.keepalive_task()
        [token] = queued
        assert DeadmanSwitch.objects.get().loop_token == uuid.UUID(token)
        tasks.keepalive_task(loop=token)
        assert queued == [token, token]
        # A scheduled run while that loop holds the sessions queues nothing.
        tasks.keepalive_task()
        assert queued == [token, token]


@pytest.mark.slow
@pytest.mark.timeout(RUN_S + 300)
@pytest.mark.django_db(databases=[])
def test_a_core_renewing_on_time_for_ten_minutes_never_sets_the_switch_off(healthy_core):
    """A real cluster keeps north's session for ten minutes while the suite loads the machine
    (tests/healthy_core.py started it with the session; this verdict is read last)."""
    assert healthy_core.ready.wait(120), "the healthy core did not start within 120 s"
    assert healthy_core.error is None, f"{healthy_core.error}\n{healthy_core.cluster_log()}"
    armed = wait_for(healthy_core.armed_at, 120)
    assert armed, "the cluster armed no session with the shard:\n" + healthy_core.describe()
    assert len(healthy_core.creatures()) == 3, "the raid's orcs are not on the shard:\n" + healthy_core.describe()
    while (left := armed + RUN_S - time.time()) > 0:
        assert healthy_core.cluster.poll() is None, "the cluster died:\n" + healthy_core.describe()
        time.sleep(min(left, 10))
    [session] = healthy_core.switch()
    assert session["lapsed"] is None, f"the switch went off under a healthy core:\n{healthy_core.describe()}"
    assert session["silent_s"] < HEALTHY_TTL_S, healthy_core.describe()
    assert len(healthy_core.creatures()) == 3, healthy_core.describe()
    [(lapses, ttl, status)] = healthy_core.query(
        "SELECT s.lapses, s.ttl_s, r.status FROM cleanup_deadmanswitch s, cleanup_run r"
    )
    assert (lapses, ttl, status) == (0, HEALTHY_TTL_S, RunStatus.RUNNING), healthy_core.describe()


def test_a_failed_renewal_counts_towards_the_backends_outage(world):
    raid()
    tick()
    world.post("/faults", json={"down": "refuse"})
    for _ in range(3):
        DeadmanSwitch.objects.update(renewed_at=timezone.now() - deadman.renew_every(TTL_S))
        [renewal] = keep_alive()
        assert not renewal.renewed and renewal.error
    assert outages.down_backends() == {("sandbox", "")}
    assert ModuleHealth.objects.get(module="sandbox").state == "down"
    assert "keepalive" in DeadmanSwitch.objects.get().last_error or DeadmanSwitch.objects.get().last_error


def test_with_the_switch_off_no_session_is_kept_or_sent(world):
    with override_settings(EVENT_DEADMAN_TTL_S=0):
        run = raid()
        tick()
        assert keep_alive() == []
    assert world.switch() == []
    assert not DeadmanSwitch.objects.exists()
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING


def test_a_reconcile_first_hears_the_lapse_so_what_the_switch_gave_back_is_reverted_not_orphaned(world):
    run = raid()
    tick()
    assert wait_until(lambda: world.lapses(), TTL_S + 2)
    summary = reconcile_module("sandbox")
    assert summary.orphaned == 0
    taken = Resource.objects.filter(run=run).exclude(kind="step")
    assert set(taken.values_list("state", flat=True)) == {"reverted"}
    assert not Resource.objects.filter(run=run, state="orphaned").exists()
    # The run the switch let go of ends at the next tick, from its log.
    tick()
    run.refresh_from_db()
    assert (
        run.status == RunStatus.ABORTED
        and "own switch" in RunLog.objects.get(run=run, kind="run.aborted").detail["error"]
    )


def test_the_keepalive_schedule_is_kept_by_name():
    from django_q.models import Schedule

    from cleanup.tasks import KEEPALIVE, KEEPALIVE_SCHEDULE_NAME, ensure_schedule

    ensure_schedule()
    ensure_schedule()
    [schedule] = Schedule.objects.filter(name=KEEPALIVE_SCHEDULE_NAME)
    assert (schedule.func, schedule.schedule_type, schedule.minutes) == (KEEPALIVE, "I", 1)


def sandbox_backends(client):
    from tests.test_api_access import API

    answer = client.get(API + "modules/").json()
    return next(m for m in answer if m["module"] == "sandbox")["backends"]


def test_people_see_each_backends_switch_and_a_runs_lapse(world, admin_client):
    from cleanup import timeline
    from tests.test_api_access import api_as

    console = api_as("view_modulehealth")
    run = raid()
    tick()
    ModuleHealth.objects.get_or_create(module="sandbox", backend="")
    [backend] = sandbox_backends(console)
    switch = backend["switch"]
    assert (switch["armed"], switch["ttl_s"], switch["holdings"], switch["lapses"]) == (True, TTL_S, 4, 0)
    assert switch["renewed_at"] and switch["last_lapse_reason"] == ""
    page = admin_client.get("/admin/cleanup/modulehealth/").content.decode()
    assert f"armed, ttl {TTL_S} s, renewed" in page and "holds 4, lapses 0" in page

    assert wait_until(lambda: world.lapses(), TTL_S + 2)
    tick()
    [backend] = sandbox_backends(console)
    switch = backend["switch"]
    assert (switch["armed"], switch["holdings"], switch["lapses"]) == (True, 0, 1)
    assert "own switch" in switch["last_lapse_reason"] and switch["last_lapse_at"]
    page = admin_client.get("/admin/cleanup/modulehealth/").content.decode()
    assert "lapses 1; last lapse: given back by sandbox&#x27;s own switch" in page
    run.refresh_from_db()
    assert "the backend&#x27;s switch gave back at" in str(timeline.svg(run))
