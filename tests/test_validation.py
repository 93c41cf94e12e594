"""Every value a run stores is checked once, in `cleanup.validation`, before the database sees it.

Each test here is one class of input that used to pass validation and fail later: deep
nesting, non-finite numbers, lone surrogates, huge integers, unbounded sizes, a lease
value the lease cannot use. Each refusal names the field it is about.
"""

import json
import time

import pytest
from django.test import override_settings

from cleanup import registry, validation
from cleanup.models import Run
from cleanup.runner import RunSpecError, start_run, validate_spec
from eventsite.sandbox.module import SPAWNER_RATE
from tests.fakes import FakeAction, FakeLease

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def modules():
    registry.register_action(FakeAction())


def refused(name="raid", steps=None):
    with pytest.raises(RunSpecError) as caught:
        start_run(name, steps if steps is not None else [{"action": "test.spawn", "params": {}}])
    assert not Run.objects.exists(), "a refused run was stored"
    return caught.value.errors


def nested(depth, leaf=1):
    value = leaf
    for _ in range(depth):
        value = {"x": value}
    return value


def test_it_refuses_params_nested_deeper_than_the_limit_naming_the_field():
    errors = refused(steps=[{"action": "test.spawn", "params": nested(500)}])
    assert list(errors) == ["steps[0].params" + ".x" * 32]
    assert errors["steps[0].params" + ".x" * 32] == "nests deeper than 32 levels"


def test_it_refuses_nesting_far_past_the_recursion_limit_without_recursing():
    deep = []
    for _ in range(100_000):
        deep = [deep]
    errors = refused(steps=[{"action": "test.spawn", "params": {"a": deep}}])
    assert list(errors.values()) == ["nests deeper than 32 levels"]


def test_it_accepts_params_nested_to_the_limit():
    run = start_run("raid", [{"action": "test.spawn", "params": nested(31)}])
    assert run.steps.get().params == nested(31)


@pytest.mark.parametrize("number", [float("inf"), float("-inf"), float("nan"), json.loads("1e400")])
def test_it_refuses_non_finite_numbers_in_params(number):
    errors = refused(steps=[{"action": "test.spawn", "params": {"rates": [1, number]}}])
    assert errors == {"steps[0].params.rates[1]": "must be a finite number"}


def test_it_refuses_integers_past_64_bits():
    errors = refused(steps=[{"action": "test.spawn", "params": {"count": 10**5000}}])
    assert errors == {"steps[0].params.count": "is a whole number larger than 64 bits"}


def test_it_refuses_lone_surrogates_in_the_name_params_and_keys():
    errors = refused(
        name="raid \ud800",
        steps=[{"action": "test.spawn", "params": {"who": "orc\udfff", "k\ud800": 1}}],
    )
    assert errors["name"] == "a name is not valid Unicode (a lone surrogate)"
    assert "steps[0].params.who" in errors or 'steps[0].params["k\\ud800"]' in errors


def test_it_names_a_bad_key_with_its_escaped_spelling():
    errors = refused(steps=[{"action": "test.spawn", "params": {"k\ud800": 1}}])
    assert errors == {'steps[0].params["k\\ud800"]': "its name is not valid Unicode (a lone surrogate)"}


def test_it_refuses_a_nul_in_an_action_id_naming_the_field():
    errors = refused(steps=[{"action": "test.\x00spawn"}])
    assert errors == {"steps[0].action": "an action id may not contain a NUL character"}


def test_it_names_a_wrong_type_for_the_name():
    assert refused(name=5)["name"] == "a name must be a string, not a number"
    assert refused(name=["raid"])["name"] == "a name must be a string, not an array"


def test_it_bounds_the_name():
    assert refused(name="x" * 201)["name"] == "a name has at most 200 characters, got 201"


def test_it_refuses_more_steps_than_event_max_steps_quickly():
    began = time.monotonic()
    errors = refused(steps=[{"action": "test.spawn", "params": {}}] * 55_000)
    assert errors == {"steps": "a run has at most 1000 steps (EVENT_MAX_STEPS), got 55000"}
    # Refused before any step is looked at: no per-step work for an oversized list.
    assert time.monotonic() - began < 5


@override_settings(EVENT_MAX_STEPS=3)
def test_it_reads_the_step_limit_from_settings():
    assert "steps" in refused(steps=[{"action": "test.spawn"}] * 4)
    assert start_run("raid", [{"action": "test.spawn"}] * 3).steps.count() == 3


def test_it_refuses_params_larger_than_event_max_params_bytes():
    errors = refused(steps=[{"action": "test.spawn", "params": {"blob": "x" * 1_000_000}}])
    assert list(errors) == ["steps[0].params"]
    assert "at most 16384 (EVENT_MAX_PARAMS_BYTES)" in errors["steps[0].params"]


@override_settings(EVENT_MAX_PARAMS_BYTES=64)
def test_it_reads_the_params_limit_from_settings():
    assert "steps[0].params" in refused(steps=[{"action": "test.spawn", "params": {"blob": "x" * 60}}])
    start_run("raid", [{"action": "test.spawn", "params": {"blob": "x" * 40}}])


class PickyLease(FakeLease):
    def validate(self, value):
        if value != "ok":
            raise ValueError(f"only 'ok' will do, got {value!r}")


def lease_step(value, lease="test.rate", target="camp"):
    return {"action": "core.lease", "params": {"lease": lease, "target": target, "value": value}}


def test_it_asks_the_lease_whether_it_can_use_the_value():
    registry.register_lease(PickyLease())
    assert refused(steps=[lease_step("banana")]) == {"steps[0].params": "value: only 'ok' will do, got 'banana'"}
    assert validate_spec("raid", [lease_step("ok")])


def test_it_contains_a_lease_validate_that_crashes():
    lease = FakeLease()
    lease.validate = lambda value: 1 / 0
    registry.register_lease(lease)
    errors = refused(steps=[lease_step(1)])
    assert errors["steps[0].params"].startswith("value: test.rate could not check it: ZeroDivisionError")


def test_a_lease_without_validate_takes_any_storable_value():
    registry.register_lease(FakeLease())
    assert validate_spec("raid", [lease_step("banana")])


@pytest.mark.parametrize("value", ["banana", None, True, -1, 1_000_001, float("nan"), [2]])
def test_it_refuses_a_spawner_rate_the_sandbox_cannot_apply(value):
    registry.register_lease(SPAWNER_RATE)
    errors = refused(steps=[lease_step(value, lease="sandbox.spawner_rate")])
    assert list(errors) == ["steps[0].params"] or list(errors) == ["steps[0].params.value"]


def test_it_accepts_a_spawner_rate_in_range():
    registry.register_lease(SPAWNER_RATE)
    assert validate_spec("raid", [lease_step(2.5, lease="sandbox.spawner_rate")])


def test_it_bounds_a_lease_target():
    registry.register_lease(FakeLease())
    errors = refused(steps=[lease_step(1, target="t" * 201)])
    assert errors == {"steps[0].params": "target has at most 200 characters, got 201"}


def test_the_json_walker_reports_only_the_first_problem_with_its_path():
    assert validation.json_problem({"a": [1, {"b": "\x00"}]}, "p") == ("p.a[1].b", "may not contain a NUL character")
    assert validation.json_problem({"a": [1, {"b": "ok"}]}, "p") is None


def test_parse_json_names_the_field_for_every_way_text_fails():
    for text, message in [
        ("[{", "is not valid JSON"),
        ("[NaN]", "is not valid JSON: NaN is not a JSON number"),
        ("[" + "1" * 5000 + "]", "is not valid JSON"),
        ("[" * 100_000, "nests deeper than 32 levels"),
        ("[1e400]", "must be a finite number"),
    ]:
        with pytest.raises(validation.Invalid) as caught:
            validation.parse_json(text, "steps")
        ((field, got),) = caught.value.errors.items()
        assert field.startswith("steps") and got.startswith(message), (text[:20], got)
