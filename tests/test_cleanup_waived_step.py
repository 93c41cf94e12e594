"""A step whose recorded rows were all resolved another way leaves only its placeholder:
the placeholder resolves without asking the module to give back whatever the step's key
made, so what a person waived stays in the world."""

import pytest

from cleanup import registry
from cleanup.manual import waive
from cleanup.models import CleanupStatus, Resource, ResourceState
from cleanup.sweep import cleanup_run
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db

REFUSED = {"ok": False, "error": "the shard will not let go", "retry": False}


def test_a_placeholder_left_alone_by_its_recorded_rows_resolves_without_a_call():
    revert = Scripted(REFUSED, {"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    placeholder, *wolves = make_rows(make_step(run), ["wolf-1", "wolf-2"])
    cleanup_run(run)  # refused for good: the wolves and their placeholder fail
    assert set(states(run).values()) == {"failed"}
    # The wolves are resolved another way (reconcile found them gone; one was waived by
    # an older version that left the placeholder behind), the placeholder is not.
    Resource.objects.filter(pk=wolves[0].pk).update(state=ResourceState.REVERTED)
    Resource.objects.filter(pk=wolves[1].pk).update(state=ResourceState.WAIVED)

    summary = cleanup_run(run, reset=True, actor="alice")  # a person's "Clean up now"

    assert len(revert.calls) == 1, f"the module was asked for the whole step: {revert.calls[1:]}"
    placeholder.refresh_from_db()
    assert placeholder.state == ResourceState.REVERTED
    run.refresh_from_db()
    assert (run.cleanup_status, summary.remaining) == (CleanupStatus.COMPLETE, 0)


def test_a_step_that_recorded_nothing_still_asks_the_module_by_its_key():
    # The step died before it recorded what it made: the empty list is the module's cue.
    revert = Scripted({"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    step = make_step(run)
    make_rows(step, [])

    cleanup_run(run)

    assert [(c["resources"], c["idempotency_key"]) for c in revert.calls] == [([], step.idempotency_key)]
    assert set(states(run).values()) == {"reverted"}


def test_waiving_every_row_a_step_recorded_waives_its_placeholder_with_them():
    registry.register_action(FakeAction(revert=Scripted(REFUSED)))
    run = make_run()
    placeholder, wolf_1, wolf_2 = make_rows(make_step(run), ["wolf-1", "wolf-2"])
    cleanup_run(run)

    waive([wolf_1], "a guard", "alice")
    placeholder.refresh_from_db()
    assert placeholder.state == ResourceState.FAILED, "wolf-2 is still the step's to give back"

    waive([wolf_2], "another guard", "alice")
    placeholder.refresh_from_db()
    assert (placeholder.state, placeholder.waived_reason, placeholder.waived_by) == (
        ResourceState.WAIVED,
        "another guard",
        "alice",
    )
    assert placeholder.last_error == REFUSED["error"], "a waiver keeps the last error"
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE
