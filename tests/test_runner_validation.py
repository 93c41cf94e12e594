"""A run spec is checked as a whole before anything is stored; each refusal names its field."""

import pytest
from django.core.management import CommandError, call_command

from cleanup import registry
from cleanup.models import Run
from cleanup.runner import RunSpecError, start_run
from tests.fakes import FakeAction, FakeLease

pytestmark = pytest.mark.django_db


def reject_negative(params):
    if params.get("count", 1) < 1:
        raise ValueError("count must be at least 1")


@pytest.fixture(autouse=True)
def modules():
    registry.register_action(FakeAction(validate=reject_negative))
    registry.register_lease(FakeLease())


SPAWN = {"action": "test.spawn", "params": {"count": 1}}


@pytest.mark.parametrize(
    "steps,field,message",
    [
        ([], "steps", "a run needs a non-empty list of steps"),
        ("spawn", "steps", "a run needs a non-empty list of steps"),
        (
            [SPAWN, {"action": "dragon.summon", "params": {}}],
            "steps[1].action",
            "no module registers the action 'dragon.summon'",
        ),
        ([SPAWN, {"action": "test.spawn", "params": {"count": 0}}], "steps[1].params", "count must be at least 1"),
        (
            [{"action": "core.lease", "params": {"lease": "nope.rate", "target": "camp", "value": 2}}],
            "steps[0].params",
            "lease: no module registers the lease 'nope.rate'",
        ),
        (
            [{"action": "core.lease", "params": {"lease": "test.rate", "value": 2}}],
            "steps[0].params",
            "target must be a non-empty string, got None",
        ),
        (
            [{"action": "core.wait", "params": {"seconds": "ten"}}],
            "steps[0].params",
            "seconds must be a number from 0 to 86400, got 'ten'",
        ),
        (
            [{"action": "core.wait", "params": {"seconds": -1}}],
            "steps[0].params",
            "seconds must be from 0 to 86400, got -1",
        ),
        (
            [{"action": "core.wait", "params": {"seconds": 86401}}],
            "steps[0].params",
            "seconds must be from 0 to 86400, got 86401",
        ),
        (
            [{"action": "core.wait", "params": {"seconds": True}}],
            "steps[0].params",
            "seconds must be a number from 0 to 86400, got True",
        ),
        (
            [{"action": "core.wait", "params": {}}],
            "steps[0].params",
            "seconds must be a number from 0 to 86400, got None",
        ),
        ([SPAWN, "wait"], "steps[1]", 'each step is an object {"action", "params"}'),
        ([{"action": "test.spawn", "params": [1]}], "steps[0].params", "params must be an object, not an array"),
    ],
)
def test_each_refusal_names_the_step_and_the_field(steps, field, message):
    with pytest.raises(RunSpecError) as refused:
        start_run("raid", steps)
    assert refused.value.errors[field] == message
    assert not Run.objects.exists(), "a refused run was stored"


def test_every_bad_step_is_named_at_once():
    with pytest.raises(RunSpecError) as refused:
        start_run("", [{"action": "x.y"}, {"action": "core.wait", "params": {"seconds": -5}}])
    assert set(refused.value.errors) == {"name", "steps[0].action", "steps[1].params"}


def test_each_step_gets_its_own_idempotency_key():
    run = start_run("raid", [SPAWN, SPAWN, {"action": "core.wait", "params": {"seconds": 0.5}}])
    keys = list(run.steps.values_list("idempotency_key", flat=True))
    assert len(set(keys)) == 3 and all(len(k) >= 32 for k in keys)
    assert list(run.steps.values_list("position", "action_id")) == [
        (0, "test.spawn"),
        (1, "test.spawn"),
        (2, "core.wait"),
    ]
    assert run.log.get().kind == "run.started"


def test_the_command_starts_a_run_and_refuses_bad_json():
    from io import StringIO

    out = StringIO()
    call_command(
        "start_run", "--name", "raid", "--steps", '[{"action": "test.spawn", "params": {"count": 2}}]', stdout=out
    )
    run = Run.objects.get()
    assert out.getvalue().strip() == f"started run {run.pk} (raid) with 1 step(s)"
    with pytest.raises(CommandError, match="--steps: is not valid JSON"):
        call_command("start_run", "--name", "raid", "--steps", "[{")
    with pytest.raises(CommandError, match=r"steps\[0\]\.action: no module registers the action 'zzz'"):
        call_command("start_run", "--name", "raid", "--steps", '[{"action": "zzz"}]')


def test_a_nul_character_is_refused_before_the_database_sees_it():
    with pytest.raises(RunSpecError) as refused:
        start_run("raid\x00", [{"action": "test.spawn", "params": {"count": 1, "note": ["a\x00b"]}}])
    assert refused.value.errors == {
        "name": "a name may not contain a NUL character",
        "steps[0].params.note[0]": "may not contain a NUL character",
    }
    with pytest.raises(RunSpecError) as refused:
        start_run("raid", [{"action": "test.spawn", "params": {"count": 1, "note": {"k": "a\x00b"}}}])
    assert refused.value.errors == {"steps[0].params.note.k": "may not contain a NUL character"}
