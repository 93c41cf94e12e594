"""A run's cleanup status is made true again by the next pass, whatever a sweeper died between."""

import pytest
from django.test import override_settings

from cleanup import registry
from cleanup import sweep as sweep_module
from cleanup.models import CleanupStatus, Resource, ResourceState
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


def test_it_completes_a_run_left_pending_with_every_row_reverted():
    # As a sweeper killed after its verdict and before the run's status leaves it.
    run = make_run(cleanup_status=CleanupStatus.PENDING)
    make_rows(make_step(run), ["orc-1", "orc-2"])
    Resource.objects.filter(run=run).update(state=ResourceState.REVERTED, revert_attempts=1)

    sweep()

    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE


@override_settings(EVENT_REVERT_MAX_ATTEMPTS=2)
def test_it_marks_incomplete_a_run_left_pending_with_its_rows_failed_at_the_ceiling():
    run = make_run(cleanup_status=CleanupStatus.PENDING)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.filter(run=run).update(state=ResourceState.FAILED, revert_attempts=2, last_error="down")

    sweep()

    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.INCOMPLETE


def test_it_leaves_a_pending_run_alone_while_its_rows_wait_out_a_backoff():
    from datetime import timedelta

    from django.utils import timezone

    run = make_run(cleanup_status=CleanupStatus.PENDING)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.filter(run=run).update(
        state=ResourceState.FAILED, revert_attempts=1, next_attempt_at=timezone.now() + timedelta(minutes=5)
    )

    sweep()

    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.PENDING


def test_a_busy_sweeper_repairs_a_stale_status_in_its_next_idle_pass(monkeypatch):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    sweep()  # the process's first pass has repaired: the next busy ones wait REPAIR_EVERY_S
    monkeypatch.setattr(sweep_module, "REPAIR_EVERY_S", 3600)
    stale = make_run(cleanup_status=CleanupStatus.PENDING)
    make_rows(make_step(stale), ["orc-1"])
    Resource.objects.filter(run=stale).update(state=ResourceState.REVERTED, revert_attempts=1)
    busy = make_run()
    make_rows(make_step(busy), ["orc-2"])

    assert sweep().runs == 1  # works the busy run, leaves the repair for later
    stale.refresh_from_db()
    assert stale.cleanup_status == CleanupStatus.PENDING

    assert sweep().runs == 0  # nothing left to claim: the idle pass repairs
    stale.refresh_from_db()
    assert stale.cleanup_status == CleanupStatus.COMPLETE


def test_a_busy_sweeper_repairs_once_its_interval_has_passed(monkeypatch):
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    monkeypatch.setattr(sweep_module, "REPAIR_EVERY_S", 0)
    stale = make_run(cleanup_status=CleanupStatus.PENDING)
    make_rows(make_step(stale), ["orc-1"])
    Resource.objects.filter(run=stale).update(state=ResourceState.REVERTED, revert_attempts=1)
    busy = make_run()
    make_rows(make_step(busy), ["orc-2"])

    assert sweep().runs == 1

    stale.refresh_from_db()
    assert stale.cleanup_status == CleanupStatus.COMPLETE
