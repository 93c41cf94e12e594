"""The sandbox module against a real shard: every shard answer mapped to the envelope."""

import threading
from unittest import mock

import pytest
from django.test import override_settings

from cleanup import calls, registry
from cleanup.calls import Outcome
from eventsite.sandbox import client, module
from eventsite.sandbox.module import SPAWN, SPAWNER_RATE
from tests import shard as shard_helpers
from tests.shard import start_shard

shard_process = shard_helpers.shard_process  # a fixture: a fresh shard per test

PARAMS = {"creature": "orc", "count": 3, "at": "north-gate"}
KEY = "run-7/step-1"


@pytest.fixture(autouse=True)
def restarted():
    """`backend_restarted` as a mock: what the module reports, and no engine behind it."""
    module.fleet.forget()
    with mock.patch("cleanup.registry.backend_restarted") as reported:
        yield reported
    module.fleet.forget()


@pytest.fixture
def sandbox(shard_process):
    """A fresh shard, with the module pointed at it and a short client timeout."""
    with override_settings(SANDBOX_SHARD_URL=shard_process.url, SANDBOX_SHARD_TIMEOUT_MS=1000):
        yield shard_process


def perform(key=KEY, **params):
    return SPAWN.perform(run_id=1, step_id=1, params={**PARAMS, **params}, idempotency_key=key)


def revert(resources, key=KEY):
    return SPAWN.revert(run_id=1, resources=resources, idempotency_key=key)


def reconcile(resources):
    return SPAWN.reconcile(run_id=1, resources=resources)


def on_shard(shard, key=KEY):
    return [c["ref"] for c in shard.get("/creatures", params={"key": key}).json()["creatures"]]


def present(shard, refs):
    return shard.post("/creatures/lookup", json={"refs": refs}).json()["present"]


def rate(shard, name="orc-camp"):
    return shard.get(f"/spawners/{name}").json()["rate"]


def refs_of(resources):
    return [r["ref"] for r in resources]


def assert_retry(answer, *fragments):
    assert answer["ok"] is False and answer["retry"] is True, answer
    for fragment in fragments:
        assert fragment in answer["error"]


def assert_unavailable(answer, *fragments):
    assert_retry(answer, *fragments)
    assert answer.get("unavailable") is True, answer


def assert_terminal(answer, *fragments):
    assert answer["ok"] is False and answer["retry"] is False, answer
    for fragment in fragments:
        assert fragment in answer["error"]


# -- registration and validation ---------------------------------------------------------


def test_the_app_registers_the_spawn_action_and_the_spawner_rate_lease():
    assert registry.get_action("sandbox.spawn") is SPAWN
    assert registry.get_lease("sandbox.spawner_rate") is SPAWNER_RATE
    assert "sandbox" in registry.modules()
    assert SPAWN.module == SPAWNER_RATE.module == "sandbox"
    for entry in (SPAWN, SPAWNER_RATE):
        assert isinstance(entry.budget_ms, int) and entry.budget_ms > 0


def test_validate_accepts_good_params():
    SPAWN.validate(PARAMS)
    SPAWN.validate({**PARAMS, "count": 1})
    SPAWN.validate({**PARAMS, "count": 500})


@pytest.mark.parametrize(
    "params,field",
    [
        (None, "params"),
        (["orc", 3, "gate"], "params"),
        ({"count": 3, "at": "gate"}, "creature"),
        ({**PARAMS, "creature": ""}, "creature"),
        ({**PARAMS, "creature": "  "}, "creature"),
        ({**PARAMS, "creature": 5}, "creature"),
        ({**PARAMS, "creature": "o" * 201}, "creature"),
        ({"creature": "orc", "at": "gate"}, "count"),
        ({**PARAMS, "count": 0}, "count"),
        ({**PARAMS, "count": 501}, "count"),
        ({**PARAMS, "count": True}, "count"),
        ({**PARAMS, "count": 2.0}, "count"),
        ({**PARAMS, "count": "3"}, "count"),
        ({**PARAMS, "count": None}, "count"),
        ({"creature": "orc", "count": 3}, "at"),
        ({**PARAMS, "at": ""}, "at"),
        ({**PARAMS, "at": ["gate"]}, "at"),
        ({**PARAMS, "cout": 3}, "cout"),
    ],
)
def test_validate_raises_a_value_error_naming_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        SPAWN.validate(params)


# -- spawn: perform, revert, reconcile ---------------------------------------------------


def test_perform_spawns_and_answers_one_creature_resource_per_creature(sandbox):
    answer = perform()
    assert answer["ok"] is True
    resources = answer["resources"]
    assert [r["kind"] for r in resources] == ["creature"] * 3
    assert refs_of(resources) == on_shard(sandbox)
    for resource in resources:
        assert resource["payload"] == {
            "creature": "orc",
            "at": "north-gate",
            "idempotency_key": KEY,
        }
    performed = calls.classify_perform(calls.Answer(raw=answer), SPAWN.id)
    assert performed.ok and len(performed.resources) == 3


def test_perform_twice_with_one_key_spawns_once(sandbox):
    first = perform()
    second = perform()
    assert second == first
    assert len(on_shard(sandbox)) == 3


def test_perform_with_bad_params_is_terminal_and_spawns_nothing(sandbox):
    before = sandbox.get("/health").json()["creatures"]
    assert_terminal(perform(count=0), "count")
    assert_terminal(SPAWN.perform(run_id=1, step_id=1, params=None, idempotency_key=KEY), "params")
    assert_terminal(perform(key=""), "idempotency key")
    assert sandbox.get("/health").json()["creatures"] == before


def test_perform_refused_by_the_shard_is_terminal_with_the_shards_message(sandbox):
    perform()
    answer = perform(count=4)  # the key already spawned 3: the shard answers 409
    assert_terminal(answer, "already spawned 3 orc")
    assert len(on_shard(sandbox)) == 3


def test_revert_despawns_the_listed_creatures(sandbox):
    resources = perform()["resources"]
    answer = revert(resources)
    assert answer == {"ok": True, "failed": {}}
    assert present(sandbox, refs_of(resources)) == []
    verdict = calls.classify_revert(calls.Answer(raw=answer), SPAWN.id, refs_of(resources))
    assert verdict.outcome is Outcome.DONE and not verdict.failed


def test_revert_of_an_empty_list_gives_back_what_the_key_spawned(sandbox):
    perform()  # the step died before its resources were recorded
    other = perform(key="another-step")["resources"]
    assert revert([]) == {"ok": True, "failed": {}}
    assert on_shard(sandbox) == []
    assert present(sandbox, refs_of(other)) == refs_of(other)


def test_revert_of_an_empty_list_revokes_the_key_so_a_late_spawn_cannot_land(sandbox):
    assert revert([], key="timed-out-step") == {"ok": True, "failed": {}}
    # The step's spawn, still on its way when the engine gave the key back, arrives now.
    assert_terminal(perform(key="timed-out-step"), "given back")
    assert on_shard(sandbox, key="timed-out-step") == []


def test_revert_of_an_empty_list_with_nothing_under_the_key_is_success(sandbox):
    assert revert([], key="never-performed") == {"ok": True, "failed": {}}


def test_revert_names_a_creature_the_shard_refuses_to_despawn_as_failed(sandbox):
    resources = perform()["resources"]
    refs = refs_of(resources)
    sandbox.post("/faults", json={"stuck": [refs[1]]})
    answer = revert(resources)
    # Each refused creature comes with the shard's reason for it.
    assert answer == {"ok": True, "failed": {refs[1]: "refused: the orc is in combat"}}
    assert present(sandbox, refs) == [refs[1]]
    verdict = calls.classify_revert(calls.Answer(raw=answer), SPAWN.id, refs)
    assert verdict.outcome is Outcome.DONE and verdict.failed == {refs[1]}
    assert verdict.reasons == {refs[1]: "refused: the orc is in combat"}


def test_revert_of_creatures_already_gone_is_success(sandbox):
    resources = perform()["resources"]
    sandbox.post("/despawn", json={"refs": refs_of(resources)[:2]})
    assert revert(resources) == {"ok": True, "failed": {}}
    assert revert(resources) == {"ok": True, "failed": {}}
    ghost = [{"kind": "creature", "ref": "cr-never-was", "payload": {}, "member_key": ""}]
    assert revert(ghost) == {"ok": True, "failed": {}}


def test_reconcile_answers_the_listed_refs_the_shard_still_has(sandbox):
    resources = perform()["resources"]
    refs = refs_of(resources)
    sandbox.post("/despawn", json={"refs": refs[:1]})
    answer = reconcile(resources)
    assert answer == {"ok": True, "in_force": refs[1:]}
    assert calls.classify_reconcile(calls.Answer(raw=answer), SPAWN.id).value == frozenset(refs[1:])
    assert reconcile([]) == {"ok": True, "in_force": []}


def test_reconcile_after_a_rollback_sees_reverted_creatures_back_in_force(sandbox):
    resources = perform()["resources"]
    sandbox.post("/save")
    assert revert(resources)["ok"] is True
    sandbox.post("/restart")  # crash: back to the save, where they were alive
    assert reconcile(resources) == {"ok": True, "in_force": refs_of(resources)}


# -- the spawner rate lease --------------------------------------------------------------


def test_read_answers_the_rate_in_force(sandbox):
    assert SPAWNER_RATE.read(target="orc-camp") == {"ok": True, "value": 1.0}


def test_read_of_an_unknown_spawner_is_terminal_with_the_shards_message(sandbox):
    assert_terminal(SPAWNER_RATE.read(target="bat-cave"), "no spawner is named 'bat-cave'")
    assert_terminal(SPAWNER_RATE.read(target=""), "target")


def test_apply_sets_the_rate(sandbox):
    assert SPAWNER_RATE.apply(value=5, run_id=1, target="orc-camp") == {"ok": True}
    assert rate(sandbox) == 5.0
    assert_terminal(SPAWNER_RATE.apply(value="fast", run_id=1, target="orc-camp"), "number")


def test_restore_puts_the_baseline_back_over_the_applied_value(sandbox):
    SPAWNER_RATE.apply(value=5, run_id=1, target="orc-camp")
    answer = SPAWNER_RATE.restore(baseline=1.0, expected=5, run_id=1, target="orc-camp")
    assert answer == {"ok": True}
    assert rate(sandbox) == 1.0


def test_restore_when_the_value_already_is_the_baseline_is_success(sandbox):
    SPAWNER_RATE.apply(value=5, run_id=1, target="orc-camp")
    SPAWNER_RATE.restore(baseline=1.0, expected=5, run_id=1, target="orc-camp")
    # The same restore again, as after an answer lost to a timeout.
    answer = SPAWNER_RATE.restore(baseline=1.0, expected=5, run_id=1, target="orc-camp")
    assert answer == {"ok": True}
    assert rate(sandbox) == 1.0


def test_restore_over_somebody_elses_value_answers_drifted_with_the_current_value(sandbox):
    SPAWNER_RATE.apply(value=5, run_id=1, target="orc-camp")
    sandbox.post("/drift", json={"spawner": "orc-camp", "rate": 7.5})
    answer = SPAWNER_RATE.restore(baseline=1.0, expected=5, run_id=1, target="orc-camp")
    assert answer == {"ok": False, "drifted": True, "current": 7.5}
    assert rate(sandbox) == 7.5
    verdict = calls.classify_revert(calls.Answer(raw=answer), SPAWNER_RATE.id)
    assert verdict.outcome is Outcome.DRIFTED and verdict.current == 7.5


def test_restore_of_an_unknown_spawner_is_terminal(sandbox):
    answer = SPAWNER_RATE.restore(baseline=1, expected=2, run_id=1, target="bat-cave")
    assert_terminal(answer, "bat-cave")


# -- a shard that is down, slow, failing or missing --------------------------------------

EVERY_CALL = {
    "perform": lambda: perform(),
    "revert": lambda: revert([{"kind": "creature", "ref": "cr-1", "payload": {}, "member_key": ""}]),
    "revert-by-key": lambda: revert([]),
    "reconcile": lambda: reconcile([{"kind": "creature", "ref": "cr-1"}]),
    "read": lambda: SPAWNER_RATE.read(target="orc-camp"),
    "apply": lambda: SPAWNER_RATE.apply(value=2, run_id=1, target="orc-camp"),
    "restore": lambda: SPAWNER_RATE.restore(baseline=1, expected=2, run_id=1, target="orc-camp"),
}


@pytest.mark.parametrize("name", EVERY_CALL)
def test_a_shard_that_refuses_connections_is_worth_a_retry(sandbox, name):
    sandbox.post("/faults", json={"down": "refuse"})
    assert_unavailable(EVERY_CALL[name](), "could not be reached")


@pytest.mark.parametrize("name", EVERY_CALL)
def test_a_shard_answering_503_is_worth_a_retry_with_its_message(sandbox, name):
    sandbox.post("/faults", json={"down": "503"})
    assert_unavailable(EVERY_CALL[name](), "the shard is down")


@pytest.mark.parametrize("name", EVERY_CALL)
def test_a_shard_slower_than_the_timeout_is_worth_a_retry(sandbox, name):
    sandbox.post("/faults", json={"latency_ms": 300})
    with override_settings(SANDBOX_SHARD_TIMEOUT_MS=100):
        assert_unavailable(EVERY_CALL[name](), "did not answer", "within 100 ms")


def test_injected_errors_are_worth_a_retry(sandbox):
    sandbox.post("/faults", json={"error_rate": 1.0})
    assert_unavailable(perform(), "injected")


def test_a_spawn_that_timed_out_but_landed_is_not_spawned_twice_on_retry(sandbox):
    sandbox.post("/faults", json={"latency_ms": 300})
    with override_settings(SANDBOX_SHARD_TIMEOUT_MS=100):
        assert_retry(perform())
    sandbox.delete("/faults")
    answer = perform()
    assert answer["ok"] is True
    assert refs_of(answer["resources"]) == on_shard(sandbox)
    assert len(on_shard(sandbox)) == 3


def test_reconcile_of_a_down_shard_fails_rather_than_reading_as_gone(sandbox):
    resources = perform()["resources"]
    sandbox.post("/faults", json={"down": "refuse"})
    answer = reconcile(resources)
    assert answer["ok"] is False and "in_force" not in answer
    assert not calls.classify_reconcile(calls.Answer(raw=answer), SPAWN.id).ok


def test_a_shard_that_is_not_running_is_worth_a_retry():
    with start_shard() as gone:
        url = gone.url
    with override_settings(SANDBOX_SHARD_URL=url, SANDBOX_SHARD_TIMEOUT_MS=500):
        for call in EVERY_CALL.values():
            assert_unavailable(call(), "could not be reached")


@pytest.mark.parametrize("url", ["", "ftp://127.0.0.1:7777", "http://"])
def test_a_missing_or_unusable_shard_url_is_terminal(url):
    with override_settings(SANDBOX_SHARD_URL=url):
        assert_terminal(perform(), "SANDBOX_SHARD_URL")


def test_the_shard_url_is_read_at_call_time(sandbox):
    with start_shard() as other:
        with override_settings(SANDBOX_SHARD_URL=other.url):
            perform(key="on-the-other-shard")
        perform(key="on-this-shard")
        assert len(on_shard(other, "on-the-other-shard")) == 3
        assert on_shard(other, "on-this-shard") == []
    assert len(on_shard(sandbox, "on-this-shard")) == 3


def test_down_verdicts_read_as_retry_and_shard_refusals_as_terminal_to_the_engine(sandbox):
    refused = perform(count=0)
    assert calls.classify_perform(calls.Answer(raw=refused), SPAWN.id).retry is False
    sandbox.post("/faults", json={"down": "503"})
    down = SPAWNER_RATE.restore(baseline=1, expected=2, run_id=1, target="orc-camp")
    assert calls.classify_revert(calls.Answer(raw=down), SPAWNER_RATE.id).outcome is Outcome.RETRY


# -- never raising -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: revert(None),
        lambda: revert([None]),
        lambda: revert([{"kind": "creature"}]),
        lambda: reconcile("cr-1"),
        lambda: SPAWNER_RATE.restore(baseline="low", expected=2, run_id=1, target="orc-camp"),
        lambda: SPAWNER_RATE.restore(baseline=1, expected=None, run_id=1, target="orc-camp"),
        lambda: SPAWNER_RATE.apply(value=True, run_id=1, target="orc-camp"),
        lambda: SPAWNER_RATE.read(target=None),
    ],
    ids=[
        "resources None",
        "resource None",
        "resource without ref",
        "resources str",
        "baseline str",
        "expected None",
        "value bool",
        "target None",
    ],
)
def test_malformed_arguments_answer_a_terminal_envelope(sandbox, call):
    answer = call()
    assert answer["ok"] is False and answer["retry"] is False


def test_an_unexpected_exception_becomes_a_retry_envelope(sandbox):
    with mock.patch.object(client.ShardClient, "http", side_effect=RuntimeError("boom")):
        for call in EVERY_CALL.values():
            assert_retry(call(), "RuntimeError", "boom")


def test_a_call_through_the_engine_never_raises(sandbox):
    sandbox.post("/faults", json={"down": "refuse"})
    answer = calls.call(
        SPAWN.revert,
        budget_ms=SPAWN.budget_ms,
        what=SPAWN.id,
        run_id=1,
        resources=[],
        idempotency_key=KEY,
    )
    assert answer.exception is None and answer.raw["retry"] is True


# -- a shard restart ---------------------------------------------------------------------


def test_the_first_boot_id_seen_is_no_restart(sandbox, restarted):
    perform()
    SPAWNER_RATE.read(target="orc-camp")
    restarted.assert_not_called()


def test_a_new_boot_id_reports_a_restart_exactly_once(sandbox, restarted):
    perform()
    sandbox.post("/restart")
    perform(key="after-the-restart")
    restarted.assert_called_once_with("sandbox", "")
    reconcile([])
    SPAWNER_RATE.read(target="orc-camp")
    revert([], key="after-the-restart")
    restarted.assert_called_once_with("sandbox", "")


def test_every_restart_is_reported_once(sandbox, restarted):
    SPAWNER_RATE.read(target="orc-camp")
    for mode in ("rollback", "wipe"):
        sandbox.post("/restart", json={"mode": mode})
        SPAWNER_RATE.read(target="orc-camp")
        SPAWNER_RATE.read(target="orc-camp")
    assert restarted.call_args_list == [mock.call("sandbox", ""), mock.call("sandbox", "")]


def test_a_restart_seen_on_an_error_answer_is_reported(sandbox, restarted):
    SPAWNER_RATE.read(target="orc-camp")
    sandbox.post("/restart")
    sandbox.post("/faults", json={"down": "503"})
    assert_retry(SPAWNER_RATE.read(target="orc-camp"))
    restarted.assert_called_once_with("sandbox", "")


def test_concurrent_calls_after_a_restart_report_it_once(sandbox, restarted):
    SPAWNER_RATE.read(target="orc-camp")
    sandbox.post("/restart")
    threads = [threading.Thread(target=lambda: SPAWNER_RATE.read(target="orc-camp")) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    restarted.assert_called_once_with("sandbox", "")


def test_a_shard_at_another_url_is_no_restart(sandbox, restarted):
    SPAWNER_RATE.read(target="orc-camp")
    with start_shard() as other, override_settings(SANDBOX_SHARD_URL=other.url):
        SPAWNER_RATE.read(target="orc-camp")
    restarted.assert_not_called()


def test_a_failing_restart_report_does_not_fail_the_call(sandbox, restarted):
    restarted.side_effect = RuntimeError("queue unavailable")
    SPAWNER_RATE.read(target="orc-camp")
    sandbox.post("/restart")
    assert SPAWNER_RATE.read(target="orc-camp") == {"ok": True, "value": 1.0}
    restarted.assert_called_once_with("sandbox", "")


def test_health_answers_ok_with_the_shards_boot_id(sandbox):
    assert SPAWN.health() == {"ok": True, "boot_id": sandbox.boot_id}
    sandbox.post("/restart")
    assert (
        SPAWN.health()
        == {"ok": True, "boot_id": sandbox.get("/health").json()["boot_id"]}
        != {
            "ok": True,
            "boot_id": sandbox.boot_id,
        }
    )


@pytest.mark.parametrize("down", ["refuse", "503"])
def test_health_says_the_shard_is_unavailable_when_it_is_down(sandbox, down):
    sandbox.post("/faults", json={"down": down})
    assert_unavailable(SPAWN.health())


def test_a_refusal_about_the_request_does_not_blame_the_shard(sandbox):
    answer = SPAWNER_RATE.read(target="bat-cave")
    assert_terminal(answer, "bat-cave")
    assert "unavailable" not in answer
