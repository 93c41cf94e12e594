"""The sandbox module as a fleet: SANDBOX_SHARDS, a step's shard, a target's shard, and every
callable talking to the shard its backend names (against two real shard processes)."""

import os
import subprocess
import sys
from unittest import mock

import pytest
from django.conf import settings
from django.test import override_settings

from cleanup import calls, outages
from cleanup.runner import RunSpecError, validate_spec
from eventsite.sandbox import module
from eventsite.sandbox.fleet import BadShards, parse_shards
from eventsite.sandbox.module import SPAWN, SPAWNER_RATE
from tests import shard as shard_helpers

shard_process = shard_helpers.shard_process
shard_fleet = shard_helpers.shard_fleet

TWO = {"north": "http://127.0.0.1:7777", "south": "http://127.0.0.1:7778"}
PARAMS = {"creature": "orc", "count": 2, "at": "north-gate"}


@pytest.fixture(autouse=True)
def restarted():
    module.fleet.forget()
    with mock.patch("cleanup.registry.backend_restarted") as reported:
        yield reported
    module.fleet.forget()


@pytest.fixture
def fleet(shard_fleet):
    with shard_fleet.settings(SANDBOX_SHARD_TIMEOUT_MS=1000):
        yield shard_fleet


def on_shard(process, key):
    return [c["ref"] for c in process.get("/creatures", params={"key": key}).json()["creatures"]]


def rate(process, spawner="orc-camp"):
    return process.get(f"/spawners/{spawner}").json()["rate"]


# -- the setting -------------------------------------------------------------------------


def test_shards_are_read_as_name_url_pairs_in_order():
    assert parse_shards("north=http://127.0.0.1:7777, south=https://south.example:8443/shard/,") == {
        "north": "http://127.0.0.1:7777",
        "south": "https://south.example:8443/shard",
    }
    assert parse_shards("") == {} and parse_shards(" , ") == {}


@pytest.mark.parametrize(
    "text, named",
    [
        ("north", "'north' is not a name=url pair"),
        ("north=http://a:1,http://b:2", "'http://b:2' is not a name=url pair"),
        ("=http://a:1", "a shard's name is letters"),
        ("no rth=http://a:1", "not 'no rth'"),
        ("north:1=http://a:1", "not 'north:1'"),
        ("north=http://a:1,north=http://b:2", "the shard 'north' is named twice"),
        ("north=ftp://a:1", "'north=ftp://a:1': the URL 'ftp://a:1' is not an http:// or https:// URL"),
        ("north=http://", "has no host"),
        ("north=http://a:port", "cannot be read"),
        ("north=", "is not an http:// or https:// URL"),
        ("north=http://a:1,south=http://a:1", "http://a:1 is already the shard 'north'"),
    ],
)
def test_a_bad_item_is_refused_naming_it(text, named):
    with pytest.raises(BadShards) as refused:
        parse_shards(text)
    assert named in str(refused.value)


@pytest.mark.slow  # a Python process reads the settings
def test_the_site_refuses_bad_shards_at_start_naming_the_item(tmp_path):
    env = {**os.environ, "DEBUG": "1", "EVENTSITE_VAR_DIR": str(tmp_path), "SANDBOX_SHARDS": "north=http://a:1,south"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-c", "import eventsite.settings"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: SANDBOX_SHARDS: 'south' is not a name=url pair" in result.stderr


@pytest.mark.slow  # a Python process reads the settings
def test_the_site_reads_its_shards_from_the_environment(tmp_path):
    env = {
        **os.environ,
        "DEBUG": "1",
        "EVENTSITE_VAR_DIR": str(tmp_path),
        "SANDBOX_SHARDS": "a=http://h:1,b=http://h:2",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-c", "import eventsite.settings as s; print(s.SANDBOX_SHARDS)"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "{'a': 'http://h:1', 'b': 'http://h:2'}", result.stderr


# -- which shard a step and a target name --------------------------------------------------


def test_a_fleet_of_one_names_no_shard_and_its_backend_is_empty():
    assert settings.SANDBOX_SHARDS == {}
    SPAWN.validate(PARAMS)
    assert SPAWN.backend_of(PARAMS) == "" and SPAWNER_RATE.backend_of("orc-camp") == ""
    assert module.fleet.names() == [""]
    with pytest.raises(ValueError, match="shard: this site has one shard .SANDBOX_SHARD_URL., which has no name"):
        SPAWN.validate({**PARAMS, "shard": "north"})
    with pytest.raises(ValueError, match="target: this site has one shard"):
        SPAWNER_RATE.backend_of("north:orc-camp")


@override_settings(SANDBOX_SHARDS=TWO)
def test_a_step_names_its_shard_and_that_is_its_backend():
    assert SPAWN.backend_of({**PARAMS, "shard": "south"}) == "south"
    SPAWN.validate({**PARAMS, "shard": "north"})
    with pytest.raises(ValueError, match="shard: no shard is named 'east'; the shards are north, south"):
        SPAWN.validate({**PARAMS, "shard": "east"})
    with pytest.raises(ValueError, match="shard must name a shard .* this site has several: north, south"):
        SPAWN.validate(PARAMS)
    with pytest.raises(ValueError, match="shard must be a non-empty string"):
        SPAWN.validate({**PARAMS, "shard": 3})


@override_settings(SANDBOX_SHARDS=TWO)
def test_a_lease_target_names_its_shard_before_a_colon():
    assert SPAWNER_RATE.backend_of("north:orc-camp") == "north"
    with pytest.raises(ValueError, match="target: no shard is named 'east'; the shards are north, south"):
        SPAWNER_RATE.backend_of("east:orc-camp")
    with pytest.raises(ValueError, match="as SHARD:SPAWNER, such as north:orc-camp.*north, south"):
        SPAWNER_RATE.backend_of("orc-camp")
    with pytest.raises(ValueError, match="SHARD:SPAWNER or SPAWNER"):
        SPAWNER_RATE.backend_of(":orc-camp")


@override_settings(SANDBOX_SHARDS={"north": "http://127.0.0.1:7777"})
def test_in_a_fleet_of_one_named_shard_a_step_that_names_none_is_on_it():
    assert SPAWN.backend_of(PARAMS) == "north" and SPAWNER_RATE.backend_of("orc-camp") == "north"


@override_settings(SANDBOX_SHARDS=TWO)
def test_a_run_naming_an_unknown_shard_or_none_is_refused_at_the_door():
    spawn = {"action": "sandbox.spawn", "params": {**PARAMS, "shard": "east"}}
    bare = {"action": "sandbox.spawn", "params": PARAMS}
    lease = {"action": "core.lease", "params": {"lease": "sandbox.spawner_rate", "target": "orc-camp", "value": 3}}
    with pytest.raises(RunSpecError) as refused:
        validate_spec("raid", [spawn, bare, lease])
    errors = refused.value.errors
    assert "no shard is named 'east'; the shards are north, south" in errors["steps[0].params"]
    assert "this site has several: north, south" in errors["steps[1].params"]
    assert "north, south" in errors["steps[2].params"]
    good = validate_spec(
        "raid",
        [
            {"action": "sandbox.spawn", "params": {**PARAMS, "shard": "south"}},
            {"action": "core.lease", "params": {**lease["params"], "target": "north:orc-camp"}},
        ],
    )
    assert [step["backend"] for step in good] == ["south", "north"]


# -- every callable talks to its backend's shard -------------------------------------------


def test_each_callable_talks_to_the_shard_its_backend_names(fleet):
    north, south = fleet["north"], fleet["south"]
    key = "run-1/step-1"
    answer = SPAWN.perform(
        run_id=1, step_id=1, params={**PARAMS, "shard": "south"}, idempotency_key=key, backend="south"
    )
    refs = [r["ref"] for r in answer["resources"]]
    assert on_shard(south, key) == refs and on_shard(north, key) == []
    resources = [{"kind": "creature", "ref": ref, "payload": {}, "member_key": ""} for ref in refs]
    assert SPAWN.reconcile(run_id=1, resources=resources, backend="south") == {"ok": True, "in_force": refs}
    assert SPAWN.reconcile(run_id=1, resources=resources, backend="north") == {"ok": True, "in_force": []}
    assert SPAWN.revert(run_id=1, resources=[], idempotency_key=key, backend="south") == {"ok": True, "failed": {}}
    assert on_shard(south, key) == []

    assert SPAWNER_RATE.apply(value=4, run_id=1, target="north:orc-camp", backend="north") == {"ok": True}
    assert (rate(north), rate(south)) == (4.0, 1.0)
    assert SPAWNER_RATE.read(target="north:orc-camp", backend="north") == {"ok": True, "value": 4.0}
    assert SPAWNER_RATE.restore(baseline=1.0, expected=4, run_id=1, target="north:orc-camp", backend="north") == {
        "ok": True
    }
    assert rate(north) == 1.0


def test_a_call_without_a_backend_goes_to_the_shard_its_params_or_target_name(fleet):
    answer = SPAWN.perform(run_id=1, step_id=1, params={**PARAMS, "shard": "north"}, idempotency_key="k")
    assert [r["ref"] for r in answer["resources"]] == on_shard(fleet["north"], "k")
    assert SPAWNER_RATE.apply(value=6, run_id=1, target="south:orc-camp") == {"ok": True}
    assert rate(fleet["south"]) == 6.0


def test_a_call_whose_backend_and_params_disagree_is_refused(fleet):
    answer = SPAWN.perform(
        run_id=1, step_id=1, params={**PARAMS, "shard": "north"}, idempotency_key="k", backend="south"
    )
    assert answer["ok"] is False and answer["retry"] is False
    assert "names the shard 'north' but is for the shard 'south'" in answer["error"]
    answer = SPAWNER_RATE.read(target="north:orc-camp", backend="south")
    assert answer["ok"] is False and "names the shard 'north'" in answer["error"]


def test_a_call_for_a_shard_the_site_does_not_have_is_terminal(fleet):
    answer = SPAWN.revert(run_id=1, resources=[], idempotency_key="k", backend="east")
    assert answer == {
        "ok": False,
        "error": "no shard is named 'east' (the shards are north, south)",
        "retry": False,
    }
    answer = SPAWNER_RATE.read(target="orc-camp")
    assert answer["ok"] is False and answer["retry"] is False
    assert "several shards (north, south): a call must name one" in answer["error"]


def test_the_engine_hands_each_callable_its_backend(fleet):
    for fn in (SPAWN.perform, SPAWN.revert, SPAWN.reconcile, SPAWN.health, SPAWNER_RATE.read, SPAWNER_RATE.apply):
        assert calls.backend_kwargs(fn, "") == {"backend": ""}
        assert calls.backend_kwargs(fn, "north") == {"backend": "north"}
    answer = calls.call(SPAWN.reconcile, budget_ms=5000, what="sandbox.spawn", backend="north", run_id=1, resources=[])
    assert answer.raw == {"ok": True, "in_force": []}


# -- health, outages and restarts, per shard -----------------------------------------------


def test_health_answers_each_shards_own_boot_id(fleet):
    assert SPAWN.health(backend="north") == {"ok": True, "boot_id": fleet["north"].boot_id}
    assert SPAWN.health(backend="south") == {"ok": True, "boot_id": fleet["south"].boot_id}
    assert fleet["north"].boot_id != fleet["south"].boot_id


@pytest.mark.parametrize("down", ["refuse", "503"])
def test_a_shard_that_is_down_is_unavailable_and_blames_only_itself(fleet, down):
    fleet["north"].post("/faults", json={"down": down})
    health = SPAWN.health(backend="north")
    assert health["ok"] is False and health["unavailable"] is True and health["retry"] is True
    assert "the shard 'north'" in health["error"]
    assert SPAWN.health(backend="south")["ok"] is True
    revert = SPAWN.revert(run_id=1, resources=[], idempotency_key="k", backend="north")
    assert outages.blame(calls.Answer(raw=revert)), "a refused connection must blame the backend"
    assert (
        outages.blame(calls.Answer(raw=SPAWN.revert(run_id=1, resources=[], idempotency_key="k", backend="south")))
        is None
    )


def test_a_restart_is_reported_for_the_shard_that_restarted(fleet, restarted):
    for backend in ("north", "south"):
        SPAWN.health(backend=backend)
    fleet["south"].post("/restart")
    for backend in ("north", "south", "north", "south"):
        SPAWN.health(backend=backend)
    restarted.assert_called_once_with("sandbox", "south")


def test_shards_on_one_fleet_each_keep_their_own_boot_ids(fleet, restarted):
    # The same URL under another name is another backend: no restart of the first.
    SPAWN.health(backend="north")
    with override_settings(SANDBOX_SHARDS={"west": fleet["north"].url}):
        SPAWN.health(backend="west")
    restarted.assert_not_called()
    assert module.fleet.client("north") is module.fleet.client("north")
    assert module.fleet.client("north") is not module.fleet.client("south")
