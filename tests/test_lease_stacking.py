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
        1 for step, index in enumerate(order) if all(index > later for later in order[step + 1:])
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
