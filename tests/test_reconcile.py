"""Rule 10: reconcile orphans what a module no longer has, and only on a clear answer."""

import time

import pytest

from cleanup import registry
from cleanup.models import Resource
from cleanup.reconcile import UnknownModule, reconcile_all, reconcile_module
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


def test_it_orphans_the_refs_missing_from_in_force_and_logs_each():
    reconcile = Scripted({"ok": True, "in_force": ["orc-1"]})
    registry.register_action(FakeAction(reconcile=reconcile))
    run = make_run()
    step = make_step(run)
    make_rows(step, ["orc-1", "orc-2", "orc-3"])

    summary = reconcile_module("test")

    assert (summary.asked, summary.in_force, summary.orphaned) == (3, 1, 2)
    assert states(run) == {
        step.idempotency_key: "live",
        "orc-1": "live",
        "orc-2": "orphaned",
        "orc-3": "orphaned",
    }
    assert [r["ref"] for r in reconcile.calls[0]["resources"]] == ["orc-1", "orc-2", "orc-3"]
    logged = sorted(e.detail["resource"] for e in run.log.filter(kind="resource.orphaned"))
    assert logged == ["creature:orc-2", "creature:orc-3"]


def slow(**kwargs):
    time.sleep(1)
    return {"ok": True, "in_force": []}


@pytest.mark.parametrize(
    "answer",
    [
        None,
        [],
        "gone",
        {"ok": "yes", "in_force": []},
        {"ok": True},
        {"ok": True, "in_force": "orc-1"},
        {"ok": False, "error": "shard down"},
        RuntimeError("boom"),
        slow,
    ],
    ids=["none", "list", "string", "ok-yes", "no-in-force", "in-force-string", "refusal", "exception", "timeout"],
)
def test_it_leaves_the_ledger_alone_on_every_non_answer(answer):
    registry.register_action(FakeAction(reconcile=Scripted(answer), budget_ms=100))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])

    summary = reconcile_module("test")

    assert summary.unanswered == 2
    assert set(states(run).values()) == {"live"}
    assert not run.log.exists()


def test_an_action_without_reconcile_is_believed():
    registry.register_action(FakeAction(reconcile=None))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])
    assert reconcile_module("test").unanswered == 1
    assert set(states(run).values()) == {"live"}


def test_reconcile_all_asks_every_module_with_live_rows():
    first = Scripted({"ok": True, "in_force": []})
    second = Scripted({"ok": True, "in_force": ["b-1"]})
    registry.register_action(FakeAction(id="a.spawn", module="a", reconcile=first))
    registry.register_action(FakeAction(id="b.spawn", module="b", reconcile=second))
    run = make_run()
    make_rows(make_step(run, action_id="a.spawn"), ["a-1"], module="a")
    make_rows(make_step(run, action_id="b.spawn"), ["b-1"], module="b")

    results = reconcile_all()

    assert sorted(results) == ["a", "b"]
    assert states(run)["a-1"] == "orphaned"
    assert states(run)["b-1"] == "live"


def test_it_does_not_orphan_a_row_the_sweep_claimed_while_the_module_answered():
    from unittest import mock

    from cleanup import reconcile as reconcile_mod

    registry.register_action(FakeAction(reconcile=Scripted({"ok": True, "in_force": []})))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    real_ask = reconcile_mod._ask

    def ask_while_a_sweeper_claims(group, *args):
        answer = real_ask(group, *args)
        Resource.objects.filter(ref="orc-1").update(state="reverting")
        return answer

    with mock.patch.object(reconcile_mod, "_ask", ask_while_a_sweeper_claims):
        summary = reconcile_module("test")

    assert summary.orphaned == 1
    assert states(run) == {"orc-1": "reverting", "orc-2": "orphaned"}
    assert run.log.filter(kind="resource.orphaned").count() == 1


def test_an_unknown_module_is_refused():
    with pytest.raises(UnknownModule, match='"nope"'):
        reconcile_module("nope")


def test_the_queries_of_a_reconcile_do_not_grow_with_the_rows_of_a_group():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    registry.register_action(FakeAction(reconcile=Scripted({"ok": True, "in_force": []})))

    def queries_for(count):
        Resource.objects.all().delete()
        make_rows(make_step(make_run()), [f"orc-{i}" for i in range(count)])
        with CaptureQueriesContext(connection) as captured:
            assert reconcile_module("test").orphaned == count
        return len(captured)

    assert queries_for(2) == queries_for(50)
