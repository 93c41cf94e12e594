"""Rule 9 for leases: a restore that answers after its claim was taken over writes nothing,
neither its own row nor the baseline it would hand down to newer leases."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from cleanup import registry
from cleanup.models import Resource, RunStatus
from cleanup.sweep import sweep
from tests.fakes import FakeLease, make_lease_row, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_stale_restore_hands_no_baseline_down_to_a_newer_lease():
    lease = registry.register_lease(FakeLease(values={"camp": 5}))
    first = make_run(name="boost to 5")
    make_lease_row(first, baseline=1, applied=5)
    later = {}
    stale = {"pending": True}

    def restore(*, baseline, expected, run_id, target):
        if stale.pop("pending", False):
            # While this restore is on its way, the claim expires: a second sweeper takes
            # the row over and restores it; a person then sets the spawner to 2, and a new
            # run leases it from there.
            with time_machine.travel(timezone.now() + timedelta(seconds=600), tick=False):
                sweep(by="second")
            lease.values["camp"] = 2
            later["run"] = make_run(status=RunStatus.RUNNING, name="boost to 3")
            later["row"] = make_lease_row(later["run"], baseline=2, applied=3)
            lease.values["camp"] = 3
            return {"ok": True}
        current = lease.values[target]
        if current not in (baseline, expected):
            return {"ok": False, "drifted": True, "current": current}
        lease.values[target] = baseline
        return {"ok": True}

    lease._restore = restore
    sweep(by="first")

    assert Resource.objects.get(pk=later["row"].pk).payload["baseline"] == 2, "a stale restore handed its baseline down"
    type(first).objects.filter(pk=later["run"].pk).update(status=RunStatus.COMPLETED)
    sweep()
    assert lease.values["camp"] == 2, "the person's change was overwritten"
