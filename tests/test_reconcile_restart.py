"""Rule 14: after a backend restart, what came back is ledgered anew and given back."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import registry
from cleanup.models import CleanupStatus, Resource
from cleanup.reconcile import reconcile_module
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


def reverted_run(refs):
    revert = Scripted({"ok": True, "failed": []})
    run = make_run()
    step = make_step(run)
    make_rows(step, refs)
    return run, step, revert


def test_it_ledgers_again_what_came_back_and_gives_it_back():
    world = {"orc-1"}  # the rolled-back shard has orc-1 again, orc-2 stays gone
    action = registry.register_action(
        FakeAction(
            revert=Scripted({"ok": True, "failed": []}),
            reconcile=lambda **kw: {"ok": True, "in_force": [r["ref"] for r in kw["resources"] if r["ref"] in world]},
        )
    )
    run, step, _ = reverted_run(["orc-1", "orc-2"])
    sweep()
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}

    summary = reconcile_module("test", restarted=True)

    assert summary.resurrected == 1
    again = Resource.objects.get(state="live")
    assert (again.ref, again.step_id, again.resurrected_from.ref) == ("orc-1", step.pk, "orc-1")
    assert run.log.get(kind="resource.resurrected").detail["previous_id"] == again.resurrected_from_id
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.PENDING

    sweep()
    again.refresh_from_db()
    assert again.state == "reverted"
    assert action.revert.calls[-1]["resources"][0]["ref"] == "orc-1"
    # A later restart asks only about the newest record of orc-1, never the first again.
    assert reconcile_module("test", restarted=True).resurrected == 1
    assert Resource.objects.filter(ref="orc-1").count() == 3
    assert Resource.objects.filter(ref="orc-1", resurrection__isnull=True).count() == 1


def test_it_looks_back_only_within_the_lookback():
    registry.register_action(
        FakeAction(
            revert=Scripted({"ok": True, "failed": []}),
            reconcile=lambda **kw: {"ok": True, "in_force": [r["ref"] for r in kw["resources"]]},
        )
    )
    reverted_run(["orc-old"])
    sweep()
    with (
        override_settings(EVENT_RECONCILE_LOOKBACK_S=60),
        time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False),
    ):
        assert reconcile_module("test", restarted=True).resurrected == 0


def test_without_a_restart_reverted_rows_are_not_asked_about():
    reconcile = Scripted({"ok": True, "in_force": ["orc-1"]})
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []}), reconcile=reconcile))
    reverted_run(["orc-1"])
    sweep()
    assert reconcile_module("test").resurrected == 0
    assert reconcile.calls == []


def test_a_restored_lease_comes_back_only_when_its_value_is_in_force_and_no_lease_holds_the_target():
    from cleanup.models import RunStatus
    from tests.fakes import FakeLease, make_lease_row

    lease = registry.register_lease(FakeLease(values={"camp": 5, "den": 3, "gate": 7}))
    run = make_run()
    make_lease_row(run, target="camp", baseline=1, applied=5)
    make_lease_row(run, target="den", baseline=1, applied=3)
    make_lease_row(run, target="gate", baseline=1, applied=7)
    sweep()
    assert lease.values == {"camp": 1, "den": 1, "gate": 1}

    # The rollback: camp and den are back at their boosts, gate at some other value...
    lease.values.update(camp=5, den=3, gate=2)
    # ...and a running run holds den now, with its own lease.
    make_lease_row(make_run(status=RunStatus.RUNNING), target="den", baseline=3, applied=3)

    assert reconcile_module("test", restarted=True).resurrected == 1
    again = Resource.objects.get(state="live", resurrected_from__isnull=False)
    assert again.ref == "test.rate#camp"
    sweep()
    assert lease.values["camp"] == 1
