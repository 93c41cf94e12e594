"""The conformance kit against a real Luanti server, with outages that really stop it."""

import pytest

from cleanup import testing
from eventsite.luanti.module import SPAWN, SPAWN_RATE, TIME_SPEED
from tests import luanti as luanti_helpers

luanti_server = luanti_helpers.luanti_server  # a fixture: a fresh server per test

# A real server may stall now and then on a loaded machine (once in five full runs, the
# cause not found yet: its log is printed with the failure); a test that fails twice in a
# row fails.
pytestmark = [pytest.mark.slow, pytest.mark.flaky(reruns=1, reruns_delay=2)]

PARAMS = {"entity": "wolf", "count": 3, "at": [0, 8, 0]}


def lines(report):
    return "\n".join(report.lines())


def test_the_spawn_action_keeps_the_contract_through_a_real_outage(luanti_server):
    with luanti_server.settings():
        report = testing.run_action_checks(SPAWN, PARAMS, outage=luanti_server.down)
    assert report.ok, lines(report)
    # Every check runs but the refusal one (a Luanti server removes any entity it is asked
    # to, so there is no refusal to provoke: the kit says so rather than guess) and the paced
    # burst (the module declares no max_rate: the mod reads its mailbox every step).
    skipped = [c.name for c in report.checks if c.status == "skip"]
    assert skipped == [
        "revert names what the backend refused as failed and gives back the rest",
        "a burst past max_rate is paced and not marked down",
    ], lines(report)


@pytest.mark.parametrize("lease,value", [(TIME_SPEED, 150), (SPAWN_RATE, 5)])
def test_the_leases_keep_the_contract_through_a_real_outage(luanti_server, lease, value):
    with luanti_server.settings():
        report = testing.run_lease_checks(lease, "default", value, outage=luanti_server.down)
    assert report.ok, lines(report)


def test_check_module_checks_the_module_from_a_shell_without_its_outage(luanti_server, capsys):
    from django.core.management import call_command

    with luanti_server.settings():
        call_command(
            "check_module", "luanti.spawn", "--params", '{"entity": "wolf", "count": 2, "at": [0, 8, 0]}', "--no-outage"
        )
        call_command("check_module", "luanti.time_speed", "--target", "default", "--value", "150", "--no-outage")
    out = capsys.readouterr().out
    assert "FAIL" not in out and "all" in out, out
