"""Rule 11 told truly: no pass summary from a sweeper whose claims were all taken over, and a
dead claim released at the ceiling is logged like any other failure."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import registry
from cleanup.models import CleanupStatus, Resource, ResourceState
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step


@pytest.mark.django_db(transaction=True)
def test_a_sweeper_whose_claim_was_taken_over_logs_no_pass_summary():
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)

    def slow_then_taken_over(**kwargs):
        # While this sweeper waits, its claim expires and a second sweeper (the module's own
        # thread, another connection) takes the row over and gives it back.
        with time_machine.travel(timezone.now() + timedelta(seconds=600), tick=False):
            registry.unregister_module("test")
            registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
            sweep(by="second")
        return {"ok": True, "failed": []}

    registry.register_action(FakeAction(revert=slow_then_taken_over))
    sweep(by="first")

    swept = list(run.log.filter(kind="cleanup.swept").values_list("detail", flat=True))
    assert [d["by"] for d in swept] == ["second"], swept
    assert swept[0]["reverted"] == 1


@pytest.mark.django_db
@override_settings(EVENT_REVERT_MAX_ATTEMPTS=2)
def test_a_dead_claim_released_at_the_ceiling_is_logged():
    run = make_run(cleanup_status=CleanupStatus.PENDING)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.filter(run=run).update(  # its sweeper died in the call
        state=ResourceState.REVERTING,
        revert_attempts=2,
        claim_expires_at=timezone.now() - timedelta(seconds=1),
        claim_called=True,
    )

    sweep()

    row = Resource.objects.get(run=run)
    assert row.state == ResourceState.FAILED
    entry = run.log.get(kind="cleanup.failed")
    assert entry.detail["resources"] == ["creature:orc-1"]
    assert entry.detail["error"] == row.last_error
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.INCOMPLETE
