"""Rule 3: one revert per step group, placeholders resolve with it, loose rows alone."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cleanup import registry
from cleanup.models import Resource
from cleanup.sweep import cleanup_run, sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


def test_it_calls_revert_once_per_step_with_the_steps_key_and_without_placeholders():
    revert = Scripted({"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    first, second = make_step(run), make_step(run)
    make_rows(first, ["orc-1", "orc-2", "orc-3"])
    make_rows(second, ["wolf-1"])

    sweep()

    assert len(revert.calls) == 2
    by_key = {c["idempotency_key"]: c for c in revert.calls}
    assert [r["ref"] for r in by_key[first.idempotency_key]["resources"]] == ["orc-1", "orc-2", "orc-3"]
    assert [r["ref"] for r in by_key[second.idempotency_key]["resources"]] == ["wolf-1"]
    assert all(r["kind"] == "creature" for c in revert.calls for r in c["resources"])
    assert set(states(run).values()) == {"reverted"}, "placeholders did not resolve with their group"


def test_a_partial_failure_reverts_the_rest_of_the_group():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": ["orc-2"]})))
    run = make_run()
    step = make_step(run)
    make_rows(step, ["orc-1", "orc-2", "orc-3"])

    sweep()

    assert states(run) == {
        step.idempotency_key: "reverted",
        "orc-1": "reverted",
        "orc-2": "failed",
        "orc-3": "reverted",
    }
    assert "orc-2" in Resource.objects.get(ref="orc-2").last_error
    assert run.log.get(kind="cleanup.failed").detail["failed"] == ["orc-2"]


def test_a_row_without_a_step_finds_the_action_it_keeps():
    revert = Scripted({"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    step = make_step(run)
    make_rows(step, ["orc-1", "orc-2"], placeholder=False)
    step.delete()

    sweep()

    assert len(revert.calls) == 2, "each row without a step is a group of its own"
    assert set(states(run).values()) == {"reverted"}


def test_a_placeholder_alone_still_gets_a_revert_with_the_steps_key():
    revert = Scripted({"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    step = make_step(run)
    make_rows(step, [])

    sweep()

    assert revert.calls == [{"run_id": run.pk, "resources": [], "idempotency_key": step.idempotency_key}]
    assert states(run) == {step.idempotency_key: "reverted"}


def test_the_queries_per_group_do_not_grow_with_its_rows():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))

    def queries_for(count):
        run = make_run()
        make_rows(make_step(run), [f"orc-{i}" for i in range(count)])
        with CaptureQueriesContext(connection) as captured:
            cleanup_run(run)
        assert set(states(run).values()) == {"reverted"}
        return len(captured)

    # A batch of 100 rows takes as many statements as a batch of 2.
    assert queries_for(2) == queries_for(100)


def test_rows_the_module_names_as_failed_are_retried_and_the_rest_are_not():
    revert = Scripted({"ok": True, "failed": ["orc-2"]}, {"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])

    from django.test import override_settings

    with override_settings(EVENT_REVERT_BACKOFF_S=0):
        sweep()
        sweep()

    assert [[r["ref"] for r in c["resources"]] for c in revert.calls] == [["orc-1", "orc-2"], ["orc-2"]]
    assert set(states(run).values()) == {"reverted"}
