"""Each unreverted row says its own reason; a reconcile may leave the refs it cannot tell about alone."""

import pytest

from cleanup import registry
from cleanup.models import Attempt, Resource
from cleanup.reconcile import reconcile_module
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def clean_registry():
    yield
    registry.unregister_module("test")


def errors(run):
    return dict(Resource.objects.filter(run=run, kind="creature").values_list("ref", "last_error"))


def test_each_failed_row_carries_the_reason_the_module_gave_for_it():
    revert = Scripted({"ok": True, "failed": {"wolf-1": "refused: the wolf is in combat", "wolf-2": "not tamed yet"}})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["wolf-1", "wolf-2", "wolf-3"])

    sweep()

    assert states(run)["wolf-3"] == "reverted"
    assert errors(run) == {
        "wolf-1": "refused: the wolf is in combat (test.spawn could not give back wolf-1)",
        "wolf-2": "not tamed yet (test.spawn could not give back wolf-2)",
        "wolf-3": "",
    }
    attempt = Attempt.objects.get(resource__ref="wolf-2")
    assert (attempt.outcome, attempt.error) == ("failed", "not tamed yet (test.spawn could not give back wolf-2)")
    entry = run.log.get(kind="cleanup.failed")
    assert entry.detail["failed"] == ["wolf-1", "wolf-2"]
    assert entry.detail["reasons"] == {"wolf-1": "refused: the wolf is in combat", "wolf-2": "not tamed yet"}


def test_a_failed_list_gives_each_row_its_own_error_without_the_others_refs():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": ["orc-1", "orc-2"]})))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2", "orc-3"])

    sweep()

    assert errors(run) == {
        "orc-1": "test.spawn could not give back orc-1",
        "orc-2": "test.spawn could not give back orc-2",
        "orc-3": "",
    }


def test_a_reason_given_as_empty_text_is_no_reason():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": {"orc-1": "  ", "orc-2": None}})))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])

    sweep()

    assert errors(run) == {
        "orc-1": "test.spawn could not give back orc-1",
        "orc-2": "test.spawn could not give back orc-2",
    }


@pytest.mark.parametrize(
    "failed",
    [{"orc-1": 3}, {"orc-9": "not asked about"}, {"orc-1": ["a list"]}],
    ids=["reason-not-text", "ref-not-asked", "reason-a-list"],
)
def test_a_malformed_object_of_reasons_is_a_failure_to_retry(failed):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": failed})))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])

    sweep()

    assert states(run) == {
        "orc-1": "failed",
        "orc-2": "failed",
        **{r.ref: r.state for r in run.resources.filter(kind="step")},
    }
    assert all("failed" in e for e in errors(run).values())


def test_a_reason_is_kept_as_text_the_ledger_can_store():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": {"orc-1": "nul\x00here " + "x" * 900}})))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    sweep()

    error = errors(run)["orc-1"]
    assert "\x00" not in error and "nul\\x00here" in error
    assert len(error) < 600 and "…" in error


def test_a_reconcile_leaves_the_refs_it_cannot_tell_about_and_settles_the_rest():
    answer = {"ok": True, "in_force": ["orc-1"], "unknown": ["orc-2"]}
    registry.register_action(FakeAction(reconcile=Scripted(answer)))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2", "orc-3"], placeholder=False)

    summary = reconcile_module("test")

    assert states(run) == {"orc-1": "live", "orc-2": "live", "orc-3": "orphaned"}
    assert (summary.asked, summary.in_force, summary.orphaned, summary.unanswered) == (2, 1, 1, 1)


@pytest.mark.parametrize(
    "answer",
    [
        {"ok": True, "in_force": ["orc-1"], "unknown": ["orc-1"]},
        {"ok": True, "in_force": [], "unknown": "orc-2"},
        {"ok": True, "in_force": [], "unknown": [7]},
    ],
    ids=["both", "not-a-list", "not-refs"],
)
def test_a_malformed_unknown_leaves_the_whole_group_alone(answer):
    registry.register_action(FakeAction(reconcile=Scripted(answer)))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)

    summary = reconcile_module("test")

    assert states(run) == {"orc-1": "live", "orc-2": "live"}
    assert summary.unanswered == 2
