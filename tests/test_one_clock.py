"""Rule 9 whatever the clocks: a worker whose clock is minutes off claims, takes over, backs
off and waits exactly as one whose clock is right, because every time that decides is the
database's (`cleanup.clock`). Each test moves this worker's clock alone (`clocks_apart`),
90 s ahead or behind, as a worker machine with a broken NTP would."""

import uuid
from datetime import timedelta

import pytest
from django.test import override_settings

from cleanup import clock, outages, rows
from cleanup.conf import claim_timeout_s
from cleanup.models import ModuleHealth, Resource, ResourceState
from cleanup.sweep import claims, runs_needing_cleanup, sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

SKEW_S = 90


def ended_run(refs=("orc-1", "orc-2")):
    run = make_run()
    make_rows(make_step(run), list(refs), placeholder=False)
    return run


def seconds_after_database_now(value):
    return (value - clock.now()).total_seconds()


@pytest.mark.django_db
@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
@override_settings(EVENT_CLAIM_TIMEOUT_S=20)
def test_a_claim_expires_on_the_databases_clock_whatever_the_workers(clocks_apart, skew):
    run = ended_run()
    clocks_apart(skew)

    batch = claims.claim([run.pk], uuid.uuid4())

    assert batch.groups, "the worker claims what is claimable"
    for row in Resource.objects.filter(run=run):
        assert row.state == ResourceState.REVERTING
        # 20 s from the database's now, not from this worker's (90 s off).
        assert 15 <= seconds_after_database_now(row.claim_expires_at) <= 21


@pytest.mark.django_db
@override_settings(EVENT_CLAIM_TIMEOUT_S=20)
def test_a_worker_whose_clock_is_ahead_takes_over_no_live_claim(clocks_apart):
    run = ended_run()
    first = claims.claim([run.pk], uuid.uuid4())
    assert first.groups
    clocks_apart(SKEW_S)  # by this worker's clock, the claim ran out 70 s ago

    assert runs_needing_cleanup(10) == []
    second = claims.claim([run.pk], uuid.uuid4())

    assert second.groups == []
    assert set(Resource.objects.filter(run=run).values_list("claim_token", flat=True)) == {first.token}


@pytest.mark.django_db
@override_settings(EVENT_CLAIM_TIMEOUT_S=20)
def test_a_worker_whose_clock_is_behind_takes_over_a_claim_that_ran_out(clocks_apart):
    run = ended_run()
    first = claims.claim([run.pk], uuid.uuid4())
    # The claim ran out a second ago, on the database's clock.
    Resource.objects.filter(run=run).update(claim_expires_at=clock.after(-1))
    clocks_apart(-SKEW_S)  # by this worker's clock, it holds for another 89 s

    assert runs_needing_cleanup(10) == [run.pk]
    second = claims.claim([run.pk], uuid.uuid4())

    assert second.groups
    assert set(Resource.objects.filter(run=run).values_list("claim_token", flat=True)) == {second.token}
    assert first.token != second.token


@pytest.mark.django_db
@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
@override_settings(EVENT_REVERT_BACKOFF_S=30)
def test_a_failed_rows_backoff_runs_on_the_databases_clock(clocks_apart, skew):
    from cleanup import registry

    registry.register_action(FakeAction(revert=Scripted({"ok": False, "error": "the shard refused"})))
    run = ended_run(refs=("orc-1",))
    clocks_apart(skew)

    sweep()

    row = Resource.objects.get(run=run)
    assert row.state == ResourceState.FAILED
    assert 25 <= seconds_after_database_now(row.next_attempt_at) <= 31


@pytest.mark.django_db
@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
def test_a_call_past_its_budget_keeps_its_claim_on_the_databases_clock(clocks_apart, skew):
    run = ended_run(refs=("orc-1",))
    Resource.objects.filter(run=run).update(state=ResourceState.FAILED, claim_token=uuid.uuid4())
    clocks_apart(skew)

    rows.keep_claims(rows.Q(run=run), timedelta(seconds=claim_timeout_s()))

    row = Resource.objects.get(run=run)
    assert claim_timeout_s() - 5 <= seconds_after_database_now(row.claim_expires_at) <= claim_timeout_s() + 1


@pytest.mark.django_db
@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
@override_settings(EVENT_OUTAGE_PROBE_S=15)
def test_a_down_backend_is_probed_and_its_rows_wait_on_the_databases_clock(clocks_apart, skew):
    run = ended_run(refs=("orc-1",))
    clocks_apart(skew)

    assert outages.mark_down("test", by="staff", reason="maintenance")

    health = ModuleHealth.objects.get(module="test")
    assert 10 <= seconds_after_database_now(health.next_probe_at) <= 16
    waiting = Resource.objects.get(run=run)
    assert 10 <= seconds_after_database_now(waiting.next_attempt_at) <= 16
    # Not due yet on the database's clock, whatever this worker's says.
    assert runs_needing_cleanup(10) == []


def test_a_predicate_on_the_databases_clock_needs_the_time_in_hand_to_judge_a_row():
    row = Resource(state=ResourceState.REVERTING, claim_expires_at=None)
    with pytest.raises(TypeError, match="time in hand"):
        rows.holds(row, rows.claim_live())


@pytest.mark.django_db
@override_settings(EVENT_CLAIM_TIMEOUT_S=20)
def test_a_ticker_whose_clock_is_ahead_takes_no_run_another_ticker_holds(clocks_apart):
    from cleanup import runner
    from cleanup.models import RunStatus

    run = make_run(status=RunStatus.RUNNING)
    assert runner._Claim(run.pk).take() == 1
    clocks_apart(SKEW_S)  # by this ticker's clock, the other's claim ran out 70 s ago

    assert run.pk not in runner.due_runs(None, 10)
    assert runner._Claim(run.pk).take() == 0
