"""Rule 13: overlapping leases on one target stack, whatever order their runs end in."""

import itertools

import pytest

from cleanup import registry
from cleanup.models import Resource, Run, RunStatus
from cleanup.sweep import sweep
from tests.fakes import FakeLease, make_lease_row, make_run

pytestmark = pytest.mark.django_db


def lease_three_runs(lease, target="camp"):
    """Three runs lease one target in turn, each reading the value it found as baseline."""
    runs = []
    for applied in (2, 3, 4):
        run = make_run(status=RunStatus.RUNNING, name=f"boost to {applied}")
        baseline = lease.read(target=target)["value"]
        make_lease_row(run, target=target, baseline=baseline, applied=applied)
        lease.apply(value=applied, run_id=run.pk, target=target)
        runs.append(run)
    return runs


def end(run):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_three_overlapping_leases_leave_the_original_value_in_any_order(order):
    lease = registry.register_lease(FakeLease(values={"camp": 1}))
    runs = lease_three_runs(lease)

    for index in order:
        end(runs[index])
        sweep()

    assert lease.values["camp"] == 1
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}
    assert len(lease.restores) == sum(
        1 for step, index in enumerate(order) if all(index > later for later in order[step + 1 :])
    ), "only the newest lease still open may call restore"


def test_an_older_lease_hands_its_baseline_down_and_logs_it():
    lease = registry.register_lease(FakeLease(values={"camp": 1}))
    first, second, _ = lease_three_runs(lease)

    end(first)
    sweep()

    assert lease.restores == []
    assert lease.values["camp"] == 4, "the newer runs' value was undone"
    handed = first.log.get(kind="cleanup.reverted")
    assert handed.detail["outcome"] == "handed_down"
    assert handed.detail["to_run"] == second.pk
    assert Resource.objects.get(run=second).payload["baseline"] == 1


def test_drift_by_someone_else_is_still_surfaced_under_stacking():
    lease = registry.register_lease(FakeLease(values={"camp": 1}))
    first, second, third = lease_three_runs(lease)
    lease.values["camp"] = 99  # a game master turned the spawner by hand

    for run in (second, first, third):
        end(run)
        sweep()

    assert lease.values["camp"] == 99, "somebody else's value was overwritten"
    row = Resource.objects.get(run=third)
    assert row.state == "drifted"
    assert row.payload["baseline"] == 1, "the baseline to put back was lost in the hand-down"


def unconfirmed(run, baseline, applied, target="camp"):
    row = make_lease_row(run, target=target, baseline=baseline, applied=applied)
    row.payload["confirmed"] = False
    row.save(update_fields=["payload"])
    return row


def test_a_newer_lease_whose_apply_never_landed_does_not_hold_the_target():
    lease = registry.register_lease(FakeLease(values={"camp": 2}))
    older = make_run(name="boost to 2")
    make_lease_row(older, baseline=1, applied=2)
    newer = make_run(name="boost to 5, apply failed")
    unconfirmed(newer, baseline=2, applied=5)

    sweep()  # the older run is swept first

    assert lease.values["camp"] == 1
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}, "a drift was reported"


def test_a_newer_lease_whose_apply_lands_after_the_older_restored_is_put_back_by_its_own_restore():
    lease = registry.register_lease(FakeLease(values={"camp": 2}))
    older = make_run(name="boost to 2")
    make_lease_row(older, baseline=1, applied=2)
    newer = make_run(status=RunStatus.RUNNING, name="boost to 5, apply on its way")
    row = unconfirmed(newer, baseline=2, applied=5)

    sweep()
    assert lease.values["camp"] == 1
    lease.values["camp"] = 5  # the apply lands now
    row.refresh_from_db()
    row.payload["confirmed"] = True
    row.save(update_fields=["payload"])
    end(newer)
    sweep()

    assert lease.values["camp"] == 1
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}


def test_a_newer_unconfirmed_lease_that_did_land_takes_the_baseline_when_the_older_restore_drifts():
    lease = registry.register_lease(FakeLease(values={"camp": 5}))  # it landed; nobody was told
    older = make_run(name="boost to 2")
    make_lease_row(older, baseline=1, applied=2)
    newer = make_run(name="boost to 5, answer lost")
    unconfirmed(newer, baseline=2, applied=5)

    sweep()

    assert lease.values["camp"] == 1
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_an_unconfirmed_lease_between_two_others_never_costs_the_original_value(order):
    lease = registry.register_lease(FakeLease(values={"camp": 4}))
    runs = [make_run(status=RunStatus.RUNNING, name=n) for n in ("to 2", "to 3 (never landed)", "to 4")]
    make_lease_row(runs[0], baseline=1, applied=2)
    unconfirmed(runs[1], baseline=2, applied=3)
    make_lease_row(runs[2], baseline=2, applied=4)

    for index in order:
        end(runs[index])
        sweep()

    assert lease.values["camp"] == 1
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}


def test_the_runner_confirms_a_lease_only_once_its_apply_answered():
    from cleanup.runner import start_run, tick
    from tests.fakes import Scripted

    lease = registry.register_lease(FakeLease(values={"camp": 1}))
    run = start_run(
        "boost",
        [
            {"action": "core.lease", "params": {"lease": "test.rate", "target": "camp", "value": 5}},
            {"action": "core.wait", "params": {"seconds": 3600}},
        ],
    )
    tick()
    assert Resource.objects.get(run=run).payload["confirmed"] is True

    lease.apply = Scripted({"ok": False, "error": "spawner locked", "retry": False})
    failed = start_run(
        "boost 2", [{"action": "core.lease", "params": {"lease": "test.rate", "target": "camp", "value": 9}}]
    )
    tick()
    assert Resource.objects.get(run=failed).payload["confirmed"] is False


def test_an_apply_that_lands_late_over_a_newer_lease_is_still_put_back():
    """Found by the stateful test: ledger order is not always the order applies land in."""
    lease = registry.register_lease(FakeLease(values={"camp": 2}))
    first = make_run(status=RunStatus.RUNNING, name="to 2")
    make_lease_row(first, baseline=1, applied=2)
    late = make_run(status=RunStatus.RUNNING, name="to 3, answer lost")
    unconfirmed(late, baseline=2, applied=3)
    newer = make_run(status=RunStatus.RUNNING, name="to 2 again")
    make_lease_row(newer, baseline=2, applied=2)
    lease.values["camp"] = 3  # the lost apply lands now, over the newer lease

    for run in (late, newer, first):
        end(run)
        sweep()

    assert lease.values["camp"] == 1
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}


def test_a_restore_that_finds_an_older_open_leases_value_hands_down_to_it():
    lease = registry.register_lease(FakeLease(values={"camp": 3}))
    older = make_run(status=RunStatus.RUNNING, name="to 3, landed late")
    unconfirmed(older, baseline=1, applied=3)
    newer = make_run(status=RunStatus.RUNNING, name="to 2")
    make_lease_row(newer, baseline=1, applied=2)

    end(newer)
    sweep()
    assert lease.values["camp"] == 3, "the older lease's value was undone while it holds the target"
    end(older)
    sweep()

    assert lease.values["camp"] == 1
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}
