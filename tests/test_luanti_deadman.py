"""The dead-man's switch against a real Luanti server (rule 34): the mod's timer gives back
what a run took when the core stops renewing its session, with no engine running, and the
core records it when it comes back without calling the server for those rows."""

import re
import time

import pytest

from cleanup.models import Attempt, CleanupStatus, DeadmanSwitch, Resource, RunStatus
from cleanup.runner import start_run, tick
from tests import luanti as luanti_helpers
from tests.story import wait_until

luanti_server = luanti_helpers.luanti_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.flaky(reruns=1, reruns_delay=2)]

TTL_S = 4
QUICK = {"EVENT_REVERT_BACKOFF_S": 0, "EVENT_STEP_BACKOFF_S": 0, "EVENT_DEADMAN_TTL_S": TTL_S}


def time_speed(server):
    return server.call("setting", setting="time_speed")["value"]


def test_the_mod_gives_back_a_runs_creatures_and_setting_on_time_with_no_core(luanti_server):
    with luanti_server.settings(**QUICK):
        run = start_run(
            "night raid",
            [
                {"action": "luanti.spawn", "params": {"entity": "wolf", "count": 2, "at": [0, 8, 0]}},
                {
                    "action": "core.lease",
                    "params": {"lease": "luanti.time_speed", "target": "default", "value": 150},
                },
                {"action": "core.wait", "params": {"seconds": 3600}},
            ],
        )
        tick()
        wolves = sorted(Resource.objects.filter(run=run, kind="creature").values_list("ref", flat=True))
        assert len(wolves) == 2 and luanti_server.present(wolves) == wolves
        assert time_speed(luanti_server) == 150
        assert DeadmanSwitch.objects.get(module="luanti").armed
        renewed = time.monotonic()

        # No engine runs now: the mod's timer gives back within the ttl and its second's grain.
        assert wait_until(
            lambda: time_speed(luanti_server) == 72 and not luanti_server.present(wolves), TTL_S + 3, every=0.1
        )
        assert time.monotonic() - renewed <= TTL_S + 3

        tick()
        tick()
        run.refresh_from_db()
        assert run.status == RunStatus.ABORTED
        assert run.cleanup_status == CleanupStatus.COMPLETE
        taken = Resource.objects.filter(run=run).exclude(kind="step")
        assert set(taken.values_list("state", flat=True)) == {"reverted"}
        assert {k for k in taken.values_list("kind", flat=True)} == {"creature", "forceload", "override"}
        for reason in taken.values_list("last_error", flat=True):
            assert re.fullmatch(
                r"given back by luanti's own switch at \d\d:\d\d: no word from the core for \d+ s", reason
            )
        # The server was not called for them: each row's one attempt is the switch's.
        assert set(Attempt.objects.filter(resource__in=taken).values_list("by", flat=True)) == {"backend switch"}
        assert Attempt.objects.filter(resource__in=taken).count() == taken.count()
        assert time_speed(luanti_server) == 72


def test_a_restart_keeps_the_mods_sessions_and_gives_them_a_full_ttl(luanti_server):
    # A mod that keeps nothing across a restart would forget what it must give back, or
    # give back at once what a still-living core holds.
    with luanti_server.settings(**{**QUICK, "EVENT_DEADMAN_TTL_S": 8}):
        run = start_run(
            "long raid",
            [
                {"action": "luanti.spawn", "params": {"entity": "wolf", "count": 2, "at": [0, 8, 0]}},
                {"action": "core.wait", "params": {"seconds": 3600}},
            ],
        )
        tick()
        wolves = sorted(Resource.objects.filter(run=run, kind="creature").values_list("ref", flat=True))
        assert luanti_server.present(wolves) == wolves
        luanti_server.restart()
        restarted = time.monotonic()
        assert "sessions" in luanti_server.state()
        assert luanti_server.present(wolves) == wolves  # not given back early
        # Nobody renews: the session still lapses, a full ttl after the restart at most.
        assert wait_until(lambda: not luanti_server.present(wolves), 8 + 4, every=0.1)
        assert time.monotonic() - restarted >= 5
        tick()
        run.refresh_from_db()
        assert run.status == RunStatus.ABORTED
        assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {"reverted"}
