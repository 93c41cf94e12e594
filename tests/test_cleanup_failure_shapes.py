"""Rule 4: every shape a failure can take reads as failure, never as a revert."""

import time

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from cleanup import calls, registry
from cleanup.calls import Answer, Outcome
from cleanup.models import Resource
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


def hang(**kwargs):
    time.sleep(2)
    return {"ok": True, "failed": []}


def boom(**kwargs):
    raise RuntimeError("shard socket closed")


FAILURES = {
    "a timeout": hang,
    "an exception": boom,
    "None": None,
    "a list": [],
    "a string": "ok",
    "ok is the string yes": {"ok": "yes"},
    "ok is 1": {"ok": 1},
    "a dict without ok": {"failed": []},
    "failed names a ref outside the group": {"ok": True, "failed": ["dragon-9"]},
    "failed is not a list": {"ok": True, "failed": "orc-1"},
}


@pytest.mark.parametrize("shape", FAILURES)
@override_settings(EVENT_REVERT_BACKOFF_S=0)
def test_it_never_reads_a_failure_shape_as_a_revert(shape):
    registry.register_action(FakeAction(revert=Scripted(FAILURES[shape]), budget_ms=100))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])

    sweep()

    rows = Resource.objects.filter(run=run)
    assert {r.state for r in rows} == {"failed"}
    assert all(r.last_error for r in rows)
    assert all(r.retryable for r in rows), "a malformed answer is worth another attempt"
    assert run.log.filter(kind="cleanup.failed").count() == 1
    assert not run.log.filter(kind="cleanup.reverted").exists()


def test_it_names_the_timeout_in_the_error():
    registry.register_action(FakeAction(revert=hang, budget_ms=50))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    started = time.monotonic()
    sweep()
    assert time.monotonic() - started < 1.5, "a hung module cost more than its budget"
    assert Resource.objects.get(run=run).last_error == "test.spawn did not answer within 50 ms"


@given(
    ok=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.text(),
        st.floats(allow_nan=False),
        st.lists(st.integers()),
        st.dictionaries(st.text(), st.integers()),
    )
)
def test_only_ok_exactly_true_is_success(ok):
    verdict = calls.classify_revert(Answer(raw={"ok": ok, "failed": []}), "x", refs=[])
    assert (verdict.outcome == Outcome.DONE) == (ok is True)
    performed = calls.classify_perform(Answer(raw={"ok": ok, "resources": []}), "x")
    assert performed.ok == (ok is True)


@given(raw=st.one_of(st.none(), st.text(), st.integers(), st.lists(st.none()), st.just({})))
def test_no_envelope_is_ever_success(raw):
    assert calls.classify_revert(Answer(raw=raw), "x").outcome == Outcome.RETRY
    assert not calls.classify_perform(Answer(raw=raw), "x").ok
    assert not calls.classify_reconcile(Answer(raw=raw), "x").ok


def test_retry_false_is_terminal_and_drifted_is_its_own_outcome():
    terminal = calls.classify_revert(Answer(raw={"ok": False, "error": "gone for good", "retry": False}), "x")
    assert (terminal.outcome, terminal.error) == (Outcome.TERMINAL, "gone for good")
    drifted = calls.classify_revert(Answer(raw={"ok": False, "drifted": True, "current": 7}), "x")
    assert (drifted.outcome, drifted.current) == (Outcome.DRIFTED, 7)
    # "drifted" on a success is still a success: ok decides first.
    assert calls.classify_revert(Answer(raw={"ok": True, "drifted": True}), "x").outcome == Outcome.DONE


def test_a_perform_reporting_a_malformed_resource_is_a_failure():
    for resources in (
        [{"ref": "a"}],
        [{"kind": "orc", "ref": ""}],
        ["orc-1"],
        [{"kind": "step", "ref": "a"}],
        [{"kind": "orc", "ref": "a", "payload": [1]}],
        {"kind": "orc"},
    ):
        assert not calls.classify_perform(Answer(raw={"ok": True, "resources": resources}), "x").ok, resources
