"""The conformance kit against real OpenArena servers, with outages that really happen."""

import pytest

from cleanup import testing
from eventsite.arena.module import BOTS, CVAR
from tests import arena as arena_helpers

arena_fleet = arena_helpers.arena_fleet  # two servers, shared by this file's tests
arena = arena_helpers.arena

pytestmark = pytest.mark.slow

PARAMS = {"count": 2, "skill": 1, "shard": "north"}


def lines(report):
    return "\n".join(report.lines())


def test_the_bots_action_keeps_the_contract_through_a_silent_outage(arena):
    with arena.settings():
        report = testing.run_action_checks(BOTS, PARAMS, backend="north", outage=arena["north"].down)
    assert report.ok, lines(report)
    assert arena["north"].bots() == [], "the kit left bots behind"
    # Only the refusal check (a server kicks any bot it is asked to) and the dead-man's switch
    # (the module keeps none: OpenArena has nowhere to run a timer of ours) are skipped.
    skipped = [c.name for c in report.checks if c.status == "skip"]
    assert skipped == [
        "revert names what the backend refused as failed and gives back the rest",
        "with no keepalive for 3 s, the backend gives back by itself what was performed under the session",
    ], lines(report)


def test_the_cvar_lease_keeps_the_contract_through_a_silent_outage(arena):
    with arena.settings():
        report = testing.run_lease_checks(CVAR, "north:g_gravity", 300, backend="north", outage=arena["north"].down)
    assert report.ok, lines(report)
    assert arena["north"].cvar("g_gravity") == "800"


def test_check_module_passes_for_both_against_a_real_server_with_a_silent_outage(arena, capsys):
    """From a shell as docs/arena.md says: the kit's silent outage (requests dropped, no
    answer) and its paced burst (the module's max_rate) included."""
    from django.core.management import call_command

    with arena.settings():
        call_command(
            "check_module", "arena.bots", "--backend", "north", "--params", '{"count": 2, "shard": "north"}', "--silent"
        )
        call_command(
            "check_module",
            "arena.cvar",
            "--backend",
            "north",
            "--target",
            "north:g_gravity",
            "--value",
            "300",
            "--silent",
        )
    out = capsys.readouterr().out
    assert "FAIL" not in out, out
    assert out.count("ok   a burst past max_rate is paced and not marked down") == 2, out
    assert "ok   with the backend down, perform answers a failure to retry" in out, out
    assert arena["north"].bots() == [] and arena["north"].cvar("g_gravity") == "800"
