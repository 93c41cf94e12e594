"""A shard outage spends no attempts: runs that end while it is down wait, then are given back.

Against a real sandbox shard process made to go down and come back; time is moved with
time-machine rather than waited for.
"""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import outages
from cleanup.models import CleanupStatus, ModuleEvent, Resource, Run
from cleanup.runner import start_run, tick
from cleanup.sweep import sweep
from tests import shard as shard_helpers

shard_process = shard_helpers.shard_process

pytestmark = pytest.mark.django_db

SETTINGS = {
    "EVENT_REVERT_MAX_ATTEMPTS": 3,
    "EVENT_REVERT_BACKOFF_S": 30,
    "EVENT_OUTAGE_AFTER": 3,
    "EVENT_OUTAGE_PROBE_S": 15,
    "EVENT_OUTAGE_SPREAD_S": 5,
    "EVENT_OUTAGE_GIVE_UP_S": 3600,
    "EVENT_CLEANUP_RUN_BATCH": 10,
    "SANDBOX_SHARD_TIMEOUT_MS": 1000,
}


def start_runs(count):
    spawn = {"action": "sandbox.spawn", "params": {"creature": "orc", "count": 2, "at": "north-gate"}}
    return [
        start_run(f"invasion {i}", [spawn, {"action": "core.wait", "params": {"seconds": 60}}]) for i in range(count)
    ]


def sweep_for(clock, seconds, every=5):
    for _ in range(seconds // every):
        sweep(by="test")
        clock.shift(timedelta(seconds=every))


def test_twenty_runs_ending_during_a_two_minute_outage_are_given_back_without_a_person(shard_process):
    with (
        override_settings(SANDBOX_SHARD_URL=shard_process.url, **SETTINGS),
        time_machine.travel(timezone.now(), tick=False) as clock,
    ):
        runs = start_runs(20)
        tick()
        tick()  # every run spawns its orcs and waits (ten runs a tick)
        assert Resource.objects.filter(kind="creature").count() == 40
        shard_process.post("/faults", json={"down": "refuse"})
        clock.shift(timedelta(seconds=61))
        tick()
        tick()  # the runs complete while the shard is down
        assert Run.objects.filter(status="completed").count() == 20
        sweep_for(clock, 120)
        assert outages.down_modules() == {"sandbox"}
        assert not Run.objects.filter(cleanup_status=CleanupStatus.INCOMPLETE).exists()
        shard_process.delete("/faults")
        sweep_for(clock, 60)

    rows = Resource.objects.filter(run__in=runs)
    assert set(rows.values_list("state", flat=True)) == {"reverted"}
    assert max(rows.values_list("revert_attempts", flat=True)) <= 1
    assert set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("cleanup_status", flat=True)) == {"complete"}
    assert (
        shard_process.post("/creatures/lookup", json={"refs": list(rows.values_list("ref", flat=True))}).json()[
            "present"
        ]
        == []
    )
    kinds = list(ModuleEvent.objects.filter(module="sandbox").order_by("id").values_list("kind", flat=True))
    assert kinds == ["module.down", "module.up"]


def test_an_outage_longer_than_the_give_up_bound_ends_incomplete_with_the_reason(shard_process):
    with (
        override_settings(SANDBOX_SHARD_URL=shard_process.url, **SETTINGS),
        time_machine.travel(timezone.now(), tick=False) as clock,
    ):
        [run] = start_runs(1)
        tick()
        shard_process.post("/faults", json={"down": "503"})
        clock.shift(timedelta(seconds=61))
        tick()
        for _ in range(3):  # three answers in a row blaming the shard mark it down
            clock.shift(timedelta(seconds=60))
            sweep(by="test")
        assert outages.down_modules() == {"sandbox"}
        clock.shift(timedelta(minutes=61))
        sweep(by="test")

    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.INCOMPLETE
    orcs = Resource.objects.filter(run=run, kind="creature")
    assert {(r.state, r.retryable) for r in orcs} == {("failed", False)}
    assert all("sandbox was down for more than 60 min" in r.last_error for r in orcs)
    assert all(r.revert_attempts <= 1 for r in orcs)
    assert ModuleEvent.objects.filter(module="sandbox", kind="module.gave_up").count() == 1


def test_two_sweepers_share_the_module_state_one_probe_per_interval(shard_process):
    with (
        override_settings(SANDBOX_SHARD_URL=shard_process.url, **SETTINGS),
        time_machine.travel(timezone.now(), tick=False) as clock,
    ):
        # The engine finds it down (a person's mark-down would hold against any probe).
        while not outages.record("sandbox", "connection refused"):
            pass
        shard_process.post("/faults", json={"down": "refuse"})
        clock.shift(timedelta(seconds=15))
        probes = [outages.probe("sandbox") for _ in range(2)]  # two sweepers, one moment
        clock.shift(timedelta(seconds=14))
        early = outages.probe("sandbox")
        shard_process.delete("/faults")
        clock.shift(timedelta(seconds=1))
        back = outages.probe("sandbox")

    assert probes == ["down", None], "both sweepers probed in one interval"
    assert early is None
    assert back == "up" and outages.down_modules() == set()
