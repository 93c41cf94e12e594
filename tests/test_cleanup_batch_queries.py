"""A pass claims and writes a batch with a few set-based statements, however many groups it holds."""

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from cleanup import registry, rows
from cleanup.models import Resource
from cleanup.sweep import dispatch, sweep
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


class Marks:
    """Counts the statements that mark a wave of calls as started, one each (an attempt is
    spent by a call): the rest of a pass's statements do not depend on its waves."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = dispatch.mark_called

        def counted(token, groups):
            self.count += 1
            return real(token, groups)

        monkeypatch.setattr(dispatch, "mark_called", counted)

    def __len__(self):
        return self.count


@pytest.fixture
def marked(monkeypatch):
    return Marks(monkeypatch)


def statements_for(runs, groups, marked):
    made = runs_with(runs, groups)
    before = len(marked)
    with CaptureQueriesContext(connection) as captured:
        sweep()
    assert all(set(states(run).values()) == {"reverted"} for run in made)
    return len(captured) - (len(marked) - before)


@override_settings(EVENT_CLEANUP_RUN_BATCH=10, EVENT_CLEANUP_GROUPS_PER_RUN=25)
def test_statements_per_group_fall_as_the_batch_grows(marked):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    one = statements_for(1, 1, marked)
    ten = statements_for(2, 5, marked)
    made = runs_with(10, 25, rows=3)

    # 250 groups (1,000 rows) in one batch: a few set-based statements, not a few per group.
    # The claim marks its groups called together; no wave of calls needs a statement of its own.
    before = len(marked)
    with CaptureQueriesContext(connection) as captured:
        sweep()

    waves = len(marked) - before
    assert all(set(states(run).values()) == {"reverted"} for run in made), "not one batch"
    others = len(captured) - waves
    assert others <= 2 * one
    assert one > ten / 10 > others / 250
    assert ten <= one
    assert waves == 0, "a claim of several groups marks them called itself, not one statement per wave"
    assert set(Resource.objects.filter(run__in=made).values_list("claim_called", "claim_shared")) == {(True, True)}


def test_a_group_claimed_alone_is_marked_called_alone_just_before_its_call(monkeypatch):
    seen = []
    real = rows.mark_called

    def mark_called(where, params, shared=False):
        seen.append(("marked", shared))
        return real(where, params, shared=shared)

    def revert(**kw):
        seen.append(("called", kw["resources"][0]["ref"]))
        return {"ok": True, "failed": []}

    monkeypatch.setattr(rows, "mark_called", mark_called)
    registry.register_action(FakeAction(revert=revert))
    run = runs_with(1, 1)[0]

    sweep()

    # Not shared: a sweeper that dies in this call has spent its attempt (rule 20).
    assert seen == [("marked", False), ("called", "r0-g0-0")]
    assert set(states(run).values()) == {"reverted"}


def test_a_batch_of_every_outcome_is_written_with_the_statements_of_one_group_and_one_more(marked):
    answers = {
        "r0-g0-0": {"ok": True, "failed": []},
        "r0-g1-0": {"ok": False, "error": "down"},
        "r0-g2-0": {"ok": True, "failed": ["r0-g2-0"]},
        "r0-g3-0": {"ok": False, "drifted": True, "current": 3},
        "r0-g4-0": {"ok": False, "error": "gone", "retry": False},
    }
    registry.register_action(FakeAction(revert=lambda **kw: answers[kw["resources"][0]["ref"]]))
    one = statements_for(1, 1, marked)
    run = runs_with(1, 5)[0]

    before = len(marked)
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
    assert len(captured) - (len(marked) - before) <= one + 1


class Verdicts:
    """The verdict statements a block sends (the statement the pass prepares, by its text)."""

    def __init__(self):
        self.sent = []

    def __call__(self, execute, sql, params, many, context):
        if f'UPDATE "{Resource._meta.db_table}" AS r SET' in sql:
            self.sent.append(sql)
        return execute(sql, params, many, context)


def test_every_outcome_of_a_batch_is_written_by_the_statement_of_a_batch_given_back_whole():
    script = {}
    registry.register_action(
        FakeAction(revert=lambda **kw: script.get(kw["resources"][0]["ref"], {"ok": True, "failed": []}))
    )
    whole = runs_with(1, 5, rows=2)[0]
    given_back = Verdicts()
    with connection.execute_wrapper(given_back):
        sweep()
    assert set(states(whole).values()) == {"reverted"}
    Resource.objects.filter(run=whole).delete()
    script.update(
        {
            "r0-g1-0": {"ok": False, "error": "down"},
            "r0-g2-0": {"ok": True, "failed": ["r0-g2-0"]},
            "r0-g3-0": {"ok": False, "drifted": True, "current": 3},
            "r0-g4-0": {"ok": False, "error": "gone", "retry": False},
        }
    )
    mixed = runs_with(1, 5)[0]
    every = Verdicts()
    with connection.execute_wrapper(every):
        sweep()

    assert {ref: state for ref, state in states(mixed).items() if ref.startswith("r0-")} == {
        "r0-g0-0": "reverted",
        "r0-g1-0": "failed",
        "r0-g2-0": "failed",
        "r0-g3-0": "drifted",
        "r0-g4-0": "failed",
    }
    # Ten rows given back alike travel as one verdict, five outcomes as five: one statement
    # text for both, prepared once, whichever verdicts a batch holds.
    assert len(given_back.sent) == len(every.sent) == 1
    assert given_back.sent == every.sent
