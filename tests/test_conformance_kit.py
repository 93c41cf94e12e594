"""The conformance kit passes the sandbox module against a real shard and names what a
broken module breaks."""

import contextlib
import time
import uuid

import pytest
from django.test import override_settings

from cleanup import registry, testing
from tests.kit_modules import module as kit
from tests.shard import shard_fleet, shard_process  # noqa: F401  (pytest fixtures)

PARAMS = {"creature": "orc", "count": 3, "at": "north-gate"}


@pytest.fixture
def on_shard(shard_process):  # noqa: F811
    with override_settings(SANDBOX_SHARD_URL=shard_process.url):
        yield shard_process


def shard_down(process):
    @contextlib.contextmanager
    def down():
        process.post("/faults", json={"down": "refuse"})
        try:
            yield
        finally:
            process.delete("/faults")

    return down


def stuck(process):
    """A refusal: while it lasts the shard refuses to despawn the creatures named."""

    @contextlib.contextmanager
    def refuse(refs):
        process.post("/faults", json={"stuck": list(refs)})
        try:
            yield
        finally:
            process.delete("/faults")

    return refuse


def failed(report):
    return {c.name for c in report.failures}


def statuses(report):
    return {c.name: c.status for c in report.checks}


def event_creatures(process):
    return [c for c in process.get("/creatures").json()["creatures"] if c["key"] is not None]


def test_it_passes_the_sandbox_action_and_gives_back_what_it_made(on_shard):
    report = testing.check_action("sandbox.spawn", PARAMS, outage=shard_down(on_shard))

    assert report.ok and len(report.checks) >= 20
    assert "revert of an empty list by key succeeds" in {c.name for c in report.checks}
    assert event_creatures(on_shard) == []


def test_it_passes_the_sandbox_lease_and_puts_the_value_back(on_shard):
    before = on_shard.get("/spawners/orc-camp").json()["rate"]

    report = testing.check_lease("sandbox.spawner_rate", "orc-camp", 5, outage=shard_down(on_shard))

    assert report.ok
    assert on_shard.get("/spawners/orc-camp").json()["rate"] == before


def test_it_refuses_the_network_for_the_outage_checks_by_default(on_shard):
    for report in (
        testing.run_action_checks(kit.HonestSpawn(), PARAMS),
        testing.run_lease_checks(kit.HonestRate(), "orc-camp", 5),
    ):
        assert report.ok, report.lines()
        assert any(c.name.startswith("with the backend down") and c.status == "ok" for c in report.checks)
    assert on_shard.get("/health").status_code == 200, "the outage ended with the checks"


def test_it_skips_the_outage_checks_when_told(on_shard):
    report = testing.run_action_checks(kit.BlindReconcile(), PARAMS, outage=None)
    assert failed(report) == {"reconcile of a malformed resource list answers a failure"}
    assert "skip with the backend down, calls answer failures to retry: no outage given" in report.lines()


def test_it_fails_a_revert_that_answers_ok_and_leaves_things_in_place(on_shard):
    report = testing.run_action_checks(kit.LyingRevert(), PARAMS)

    assert "reconcile after a revert reports nothing in force" in failed(report)
    assert "the kit's own cleanup leaves nothing in force" in failed(report)


def test_it_fails_a_perform_that_makes_new_things_on_a_repeated_key(on_shard):
    report = testing.run_action_checks(kit.NewThingsOnRepeat(), PARAMS)

    assert failed(report) == {
        "perform twice with one key makes the same refs and nothing new",
        "revert of an empty list gives back what the key made",  # it spawned under other keys
    }
    assert event_creatures(on_shard) == []  # the kit gave back both spawns, by ref


def test_it_fails_a_restore_that_overwrites_someone_elses_value(on_shard):
    report = testing.run_lease_checks(kit.OverwritingRestore(), "orc-camp", 5)

    assert failed(report) == {
        "restore with a value someone else set answers drifted with the current value",
        "restore leaves someone else's value alone",
    }
    line = next(c.line() for c in report.failures if "drifted" in c.name)
    assert line.startswith("FAIL restore with a value someone else set")
    assert 'expected {"ok": False, "drifted": True, "current": 6}; got {\'ok\': True}' in line


def test_it_fails_a_restore_that_refuses_the_baseline_already_in_place(on_shard):
    report = testing.run_lease_checks(kit.StrictRestore(), "orc-camp", 5)
    assert failed(report) == {"restore when the baseline is already in place succeeds"}


def test_it_fails_a_reconcile_that_answers_an_empty_list_when_its_backend_is_down(on_shard):
    report = testing.run_action_checks(kit.BlindReconcile(), PARAMS, outage=shard_down(on_shard))
    assert failed(report) == {
        "with the backend down, reconcile answers a failure, never a list",
        "reconcile of a malformed resource list answers a failure",  # it says [] there too
    }


def test_it_fails_a_transient_failure_answered_as_permanent(on_shard):
    report = testing.run_action_checks(kit.PermanentWhenDown(), PARAMS, outage=shard_down(on_shard))
    assert failed(report) == {"with the backend down, perform answers a failure to retry"}


def test_it_fails_a_call_that_raises(on_shard):
    report = testing.run_action_checks(kit.RaisingRevert(), PARAMS)

    assert {"no call raises", "revert of an empty list by key succeeds"} <= failed(report)
    raised = next(c for c in report.failures if c.name == "no call raises")
    assert "kit.raising_revert.revert raised IndexError" in raised.got


def test_it_fails_a_call_that_outlives_its_budget(on_shard):
    slow = kit.HonestRate()
    slow.budget_ms = 200
    on_shard.post("/faults", json={"latency_ms": 400})

    report = testing.run_lease_checks(slow, "orc-camp", 5)

    assert "every call answers within its budget (200 ms)" in failed(report)


def test_it_fails_answers_that_are_no_envelope():
    class Sloppy(registry.Action):
        id, module = "sloppy.spawn", "sloppy"

        def perform(self, **kwargs):
            return {"ok": "yes", "resources": []}

    report = testing.run_action_checks(Sloppy(), {})

    assert {"every callable answers an envelope", "perform answers resources", "declares revert"} <= failed(report)


def test_check_action_raises_an_assertion_error_listing_the_failed_checks(on_shard):
    registry.register_action(kit.LyingRevert())
    with pytest.raises(AssertionError) as raised:
        testing.check_action("kit.lying_revert", PARAMS)
    message = str(raised.value)
    assert message.startswith("action kit.lying_revert breaks the module contract:")
    assert "FAIL reconcile after a revert reports nothing in force" in message
    assert "ok   " not in message


def test_check_action_refuses_an_unknown_id():
    with pytest.raises(LookupError, match="no module registers the action 'atlantis.sink'"):
        testing.check_action("atlantis.sink", {})


def test_validate_must_name_the_field_it_refuses():
    class Vague(registry.Action):
        id, module = "vague.spawn", "vague"
        revert = None

        def validate(self, params):
            if not isinstance(params.get("count"), int):
                raise ValueError("bad params")

        def perform(self, **kwargs):
            return {"ok": True, "resources": []}

    report = testing.run_action_checks(Vague(), {"count": 2})

    check = next(c for c in report.checks if c.name == "validate names the bad field (count)")
    assert check.failed and "does not name count" in check.got


# -- backends, health() and per-ref reasons ------------------------------------------------


@pytest.fixture
def fleet(shard_fleet):  # noqa: F811
    with shard_fleet.settings():
        yield shard_fleet


def test_it_checks_one_backend_of_a_fleet_with_its_health_and_its_reasons(fleet):
    north, south = fleet["north"], fleet["south"]

    report = testing.check_action(
        "sandbox.spawn", {**PARAMS, "shard": "north"}, outage=shard_down(north), backend="north", refuse=stuck(north)
    )

    assert report.subject == "action sandbox.spawn on backend 'north'"
    checks = statuses(report)
    for name in (
        "backend_of names the backend of the params",
        "health answers ok while the backend is up",
        "health answers the backend's boot id, the same while it runs",
        "with the backend down, health answers a failure with unavailable: true",
        "failed is a list of refs or an object of refs and reasons",
        "revert names what the backend refused as failed and gives back the rest",
        "revert says why for each ref it could not give back",
    ):
        assert checks[name] == "ok", name
    assert event_creatures(north) == []
    assert "POST /spawn" not in south.stderr(), "the kit called the other shard"


def test_it_checks_a_lease_on_one_backend_with_the_modules_health(fleet):
    report = testing.check_lease("sandbox.spawner_rate", "south:orc-camp", 5, backend="south")
    assert report.subject == "lease sandbox.spawner_rate on 'south:orc-camp' on backend 'south'"
    assert statuses(report)["health answers ok while the backend is up"] == "ok"
    assert (
        fleet["north"].get("/spawners/orc-camp").json()["rate"]
        == fleet["south"].get("/spawners/orc-camp").json()["rate"]
    )


def test_it_fails_a_backend_the_params_do_not_name(fleet):
    report = testing.run_action_checks(
        registry.get_action("sandbox.spawn"), {**PARAMS, "shard": "north"}, backend="south"
    )
    check = next(c for c in report.failures if c.name == "backend_of names the backend of the params")
    assert check.expected == "'south', the backend given" and check.got == "'north'"


def test_without_a_backend_it_calls_the_one_the_params_name(fleet):
    report = testing.run_action_checks(registry.get_action("sandbox.spawn"), {**PARAMS, "shard": "south"})
    assert report.ok, report.lines()
    assert report.subject == "action sandbox.spawn on backend 'south'"
    assert "POST /spawn" not in fleet["north"].stderr()


def test_it_fails_params_that_name_no_backend(fleet):
    report = testing.run_action_checks(registry.get_action("sandbox.spawn"), PARAMS, outage=None)
    check = next(c for c in report.failures if c.name == "backend_of names the backend of the params")
    assert "this site has several: north, south" in check.got


class RestlessHealth(kit.HonestSpawn):
    """A boot id of its own making on every answer: every watch would look like a restart."""

    def health(self, *, backend=""):
        return {"ok": True, "boot_id": uuid.uuid4().hex}


class QuietHealth(kit.HonestSpawn):
    """Says the backend is down without saying unavailable: the engine reads it as an answer."""

    def health(self, *, backend=""):
        answer = super().health(backend=backend)
        return {k: v for k, v in answer.items() if k != "unavailable"}


def test_it_fails_a_health_whose_boot_id_changes_at_every_answer(on_shard):
    report = testing.run_action_checks(RestlessHealth(), PARAMS, outage=None)
    assert failed(report) == {"health answers the backend's boot id, the same while it runs"}


def test_it_fails_a_health_that_does_not_say_unavailable_when_the_backend_is_down(on_shard):
    report = testing.run_action_checks(QuietHealth(), PARAMS, outage=shard_down(on_shard))
    assert failed(report) == {"with the backend down, health answers a failure with unavailable: true"}


def test_a_module_without_health_is_told_what_it_misses(on_shard):
    class NoHealth(kit.HonestSpawn):
        health = None

    report = testing.run_action_checks(NoHealth(), PARAMS, outage=None)
    assert report.ok
    line = next(line for line in report.lines() if "health" in line)
    assert line.startswith("skip health answers ok while the backend is up: the module has no health()")


class ReasonsByNumber(kit.HonestSpawn):
    """Gives each refused ref a number instead of a reason."""

    def revert(self, **kwargs):
        answer = super().revert(**kwargs)
        if answer.get("ok") and answer["failed"]:
            return {"ok": True, "failed": {ref: 1 for ref in answer["failed"]}}
        return answer


class RefusedAsAList(kit.HonestSpawn):
    """Names what was refused, but not why."""

    def revert(self, **kwargs):
        answer = super().revert(**kwargs)
        return {"ok": True, "failed": list(answer["failed"])} if answer.get("ok") else answer


def test_it_fails_failed_reasons_that_are_not_text(on_shard):
    report = testing.run_action_checks(ReasonsByNumber(), PARAMS, outage=None, refuse=stuck(on_shard))
    assert failed(report) == {
        "failed is a list of refs or an object of refs and reasons",
        "revert names what the backend refused as failed and gives back the rest",
    }
    assert event_creatures(on_shard) == []


def test_a_revert_that_names_refused_refs_without_reasons_passes_and_is_told(on_shard):
    report = testing.run_action_checks(RefusedAsAList(), PARAMS, outage=None, refuse=stuck(on_shard))
    assert report.ok, report.lines()
    assert statuses(report)["revert says why for each ref it could not give back"] == "skip"


def test_it_skips_the_refusal_when_it_cannot_make_the_backend_refuse(on_shard):
    report = testing.run_action_checks(kit.HonestSpawn(), PARAMS, outage=None)
    assert statuses(report)["revert names what the backend refused as failed and gives back the rest"] == "skip"


def test_it_passes_the_sandbox_shards_switch_which_gives_back_on_time(on_shard):
    report = testing.run_action_checks(registry.get_action("sandbox.spawn"), PARAMS, outage=None)
    assert report.ok, report.lines()
    assert statuses(report)[SWITCH] == "ok"
    assert event_creatures(on_shard) == []


def test_it_fails_a_module_whose_backend_does_not_give_back_on_time(on_shard):
    report = testing.run_action_checks(kit.SwitchThatNeverFires(), PARAMS, outage=None)
    assert SWITCH in failed(report)
    assert "the next keepalive answers that the session lapsed, naming what was given back" in failed(report)
    # The kit still gave back what it made, itself.
    assert event_creatures(on_shard) == []


SWITCH = "with no keepalive for 3 s, the backend gives back by itself what was performed under the session"
# -- the silent outage and the paced burst ------------------------------------------------


def test_the_silent_outage_drops_what_is_sent_and_times_out_reads():
    import socket as socket_module

    from cleanup.testing import network_silent

    with socket_module.socket(socket_module.AF_INET, socket_module.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(0.3)
        with network_silent(), socket_module.socket(socket_module.AF_INET, socket_module.SOCK_DGRAM) as client:
            client.connect(server.getsockname())
            client.settimeout(0.2)
            assert client.send(b"ping") == 4
            began = time.monotonic()
            with pytest.raises(TimeoutError):
                client.recv(100)
            assert time.monotonic() - began >= 0.15
        with pytest.raises(TimeoutError):
            server.recv(100)  # nothing was really sent


@pytest.mark.django_db(transaction=True)
def test_a_burst_past_a_backend_limit_stricter_than_max_rate_fails_the_paced_check():
    from cleanup.testing.backends import PACED

    answered = []

    class Strict(registry.Action):
        id = "strict.ping"
        module = "strict"
        max_rate = 50.0  # the backend takes far fewer than it declares
        max_burst = 2

        def perform(self, **kwargs):
            return {"ok": True, "resources": []}

        def health(self, *, backend=""):
            answered.append(time.monotonic())
            if len(answered) > 3:
                return {"ok": False, "error": "dropped", "retry": True, "unavailable": True}
            return {"ok": True, "boot_id": "b1"}

    from cleanup.testing.backends import check_paced_burst
    from cleanup.testing.report import Caller

    entry = Strict()
    report = testing.Report("strict")
    check_paced_burst(report, Caller(entry, ""), entry)
    assert not report.ok
    assert [c.name for c in report.checks] == [PACED]
