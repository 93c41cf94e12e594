"""A pass claims and writes a batch with a few set-based statements, however many groups it holds."""

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from cleanup import registry
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


def runs_with(runs, groups, rows=1):
    made = []
    for r in range(runs):
        run = make_run(name=f"run {r}")
        for g in range(groups):
            make_rows(make_step(run), [f"r{r}-g{g}-{i}" for i in range(rows)])
        made.append(run)
    return made


def statements_for(runs, groups):
    made = runs_with(runs, groups)
    with CaptureQueriesContext(connection) as captured:
        sweep()
    assert all(set(states(run).values()) == {"reverted"} for run in made)
    return len(captured)


@override_settings(EVENT_CLEANUP_RUN_BATCH=10, EVENT_CLEANUP_GROUPS_PER_RUN=25)
def test_statements_per_group_fall_as_the_batch_grows(django_assert_max_num_queries):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    one = statements_for(1, 1)
    ten = statements_for(2, 5)
    made = runs_with(10, 25, rows=3)

    # 250 groups (1,000 rows) in one batch: a few set-based statements, not a few per group.
    # (SQLite splits a long insert in chunks of its parameter limit; PostgreSQL does not.)
    with django_assert_max_num_queries(2 * one) as captured:
        sweep()

    assert all(set(states(run).values()) == {"reverted"} for run in made), "not one batch"
    assert one > ten / 10 > len(captured) / 250
    assert ten <= one


def test_a_batch_of_every_outcome_is_written_with_the_statements_of_one_group_and_one_more():
    answers = {
        "r0-g0-0": {"ok": True, "failed": []},
        "r0-g1-0": {"ok": False, "error": "down"},
        "r0-g2-0": {"ok": True, "failed": ["r0-g2-0"]},
        "r0-g3-0": {"ok": False, "drifted": True, "current": 3},
        "r0-g4-0": {"ok": False, "error": "gone", "retry": False},
    }
    registry.register_action(FakeAction(revert=lambda **kw: answers[kw["resources"][0]["ref"]]))
    one = statements_for(1, 1)
    run = runs_with(1, 5)[0]

    with CaptureQueriesContext(connection) as captured:
        sweep()

    assert {ref: state for ref, state in states(run).items() if ref.startswith("r0-")} == {
        "r0-g0-0": "reverted",
        "r0-g1-0": "failed",
        "r0-g2-0": "failed",
        "r0-g3-0": "drifted",
        "r0-g4-0": "failed",
    }
    # Whole groups are written by step, and the group whose answer failed one of its rows
    # by row: one UPDATE more than a batch of one group, however many groups it holds.
    assert len(captured) <= one + 1
