"""A row's history: every attempt to give it back, with its outcome and error, read by row."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import registry, rows
from cleanup.models import Attempt, Resource, ResourceState
from cleanup.sweep import sweep
from tests.fakes import FakeAction, FakeLease, Scripted, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

DOWN = {"ok": False, "error": "shard is down", "retry": True}


def history(row):
    """The row's attempts as staff read them (the admin's row page, the archive of a pruned run)."""
    row.refresh_from_db()
    return [(a.number, a.outcome, a.error) for a in rows.history(row, Attempt.objects.filter(resource=row))]


def test_it_records_each_attempt_of_a_row_newest_first():
    registry.register_action(
        FakeAction(
            revert=Scripted(DOWN, {"ok": False, "error": "timed out", "retry": True}, {"ok": True, "failed": []})
        )
    )
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    with override_settings(EVENT_REVERT_BACKOFF_S=0):
        sweep()
        sweep()
        sweep()

    orc = Resource.objects.get(run=run, ref="orc-1")
    assert orc.state == ResourceState.REVERTED
    assert history(orc) == [(3, "done", ""), (2, "retry", "timed out"), (1, "retry", "shard is down")]


def test_it_records_a_ref_the_module_could_not_give_back_as_failed():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": ["orc-2"]})))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])

    sweep()

    assert history(Resource.objects.get(run=run, ref="orc-1")) == [(1, "done", "")]
    [(number, outcome, error)] = history(Resource.objects.get(run=run, ref="orc-2"))
    assert (number, outcome) == (1, "failed") and "orc-2" in error


def test_it_records_a_terminal_verdict_with_its_reason():
    run = make_run()
    make_rows(make_step(run, action_id="gone.spawn"), ["orc-1"], placeholder=False)

    sweep()

    [(number, outcome, error)] = history(Resource.objects.get(run=run, ref="orc-1"))
    assert (number, outcome) == (1, "terminal") and "gone.spawn" in error


def test_it_records_a_dead_claim_at_the_ceiling_as_expired():
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    past = timezone.now() - timedelta(minutes=5)
    Resource.objects.filter(run=run).update(
        state=ResourceState.REVERTING,
        revert_attempts=3,
        claim_expires_at=past,
        claim_token=None,
        claim_called=True,  # died in the call
    )

    with override_settings(EVENT_REVERT_MAX_ATTEMPTS=3):
        sweep()

    orc = Resource.objects.get(run=run, ref="orc-1")
    assert orc.state == ResourceState.FAILED
    assert history(orc) == [(3, "expired", "the sweeper that claimed this stopped before it had an answer")]


def test_a_dead_claim_marked_with_its_wave_gets_its_attempt_back_and_is_taken_over_with_the_other_suspects():
    # Rule 20: a wave-mate may have killed the sweeper before this row's call started.
    calls = []
    registry.register_action(FakeAction(revert=lambda **kw: calls.append(kw) or {"ok": True, "failed": []}))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    make_rows(make_step(run, position=1), ["orc-2"], placeholder=False)
    past = timezone.now() - timedelta(minutes=5)
    Resource.objects.filter(run=run).update(
        state=ResourceState.REVERTING,
        revert_attempts=3,
        claim_expires_at=past,
        claim_token=None,
        claim_called=True,
        claim_shared=True,
    )

    with override_settings(EVENT_REVERT_MAX_ATTEMPTS=3):
        first = sweep()

    # Not released at the ceiling: the attempt is given back, and the dead claim's suspect
    # groups are taken over together (rule 20), so one pass gives back both.
    assert first.summary.attempted == 2 and len(calls) == 2
    assert {r.state for r in Resource.objects.filter(run=run)} == {ResourceState.REVERTED}
    assert [history(r) for r in Resource.objects.filter(run=run)] == [[(3, "done", "")], [(3, "done", "")]]


def test_a_dead_claim_called_alone_has_spent_its_attempt():
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.filter(run=run).update(
        state=ResourceState.REVERTING,
        revert_attempts=1,
        claim_expires_at=timezone.now() - timedelta(minutes=5),
        claim_token=None,
        claim_called=True,
        claim_shared=False,
    )
    registry.register_action(FakeAction(revert=Scripted({"ok": False, "error": "shard said no", "retry": True})))

    sweep()

    assert history(Resource.objects.get(run=run, ref="orc-1")) == [(2, "retry", "shard said no")]


@pytest.mark.django_db(transaction=True)
def test_it_records_nothing_for_a_verdict_that_came_after_a_takeover():
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)

    def slow_then_taken_over(**kwargs):
        # The module's own thread (another connection) plays a second sweeper that takes
        # the expired claim over and gives the row back, while this call is still out.
        with time_machine.travel(timezone.now() + timedelta(seconds=600), tick=False):
            registry.unregister_module("test")
            registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
            sweep()
        return {"ok": False, "error": "first sweeper: shard said no"}

    registry.register_action(FakeAction(revert=slow_then_taken_over))
    sweep()

    assert history(Resource.objects.get(run=run, ref="orc-1")) == [(2, "done", "")]


def test_it_records_a_lease_handing_its_baseline_down():
    registry.register_lease(FakeLease(values={"camp": 5}))
    older, newer = make_run(), make_run()
    old_row = make_lease_row(older, baseline=1, applied=3)
    make_lease_row(newer, baseline=3, applied=5)
    newer.status = "running"
    newer.save(update_fields=["status"])

    sweep()

    [(number, outcome, error)] = history(Resource.objects.get(pk=old_row.pk))
    assert (number, outcome) == (1, "done") and "handed its baseline down" in error


def test_a_row_given_back_is_its_own_record_and_its_history_says_by_whom():
    """A give-back writes no attempt row of its own: the row says it (reverted, its attempt's
    number and time) and its pass's ``cleanup.swept`` entry says by whom; staff see it all."""
    registry.register_action(FakeAction(revert=Scripted(DOWN, {"ok": True, "failed": []})))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    with override_settings(EVENT_REVERT_BACKOFF_S=0):
        sweep(by="nightly")
        sweep(by="alice")

    orc = Resource.objects.get(run=run, ref="orc-1")
    assert [(a.number, a.outcome) for a in Attempt.objects.filter(resource=orc)] == [(1, "retry")]
    shown = rows.history(orc, Attempt.objects.filter(resource=orc))
    assert [(a.number, a.outcome, a.at, a.by) for a in shown] == [
        (2, "done", orc.resolved_at, "alice"),
        (1, "retry", shown[1].at, "nightly"),
    ]
    assert shown[1].at < orc.resolved_at
