"""A run's cleanup turning complete logs one ``cleanup.completed``, apart from its passes.

``cleanup.swept`` follows every pass that attempted anything, whatever it left; a console
that wants "done" reads ``cleanup.completed`` instead of a pass's ``detail.remaining``.
"""

import pytest
from django.test import override_settings

from cleanup import registry
from cleanup.admin.lists import LogKindFilter
from cleanup.manual import waive
from cleanup.models import CleanupStatus, Resource
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, log_kinds, make_rows, make_run, make_step
from tests.test_api_access import API, api_as

pytestmark = pytest.mark.django_db

DOWN = {"ok": False, "error": "shard is down", "retry": True}
GIVEN_BACK = {"ok": True, "failed": []}


def test_a_pass_that_leaves_rows_logs_no_completion_and_the_one_that_finishes_logs_exactly_one():
    registry.register_action(FakeAction(revert=Scripted(DOWN, DOWN, GIVEN_BACK)))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)

    with override_settings(EVENT_REVERT_BACKOFF_S=0, EVENT_REVERT_MAX_ATTEMPTS=5):
        sweep()
        sweep()
        assert log_kinds(run).count("cleanup.swept") == 2
        assert "cleanup.completed" not in log_kinds(run), "a pass that left rows said the cleanup completed"
        sweep()
        sweep()  # nothing left: no pass, and no second completion

    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE
    kinds = log_kinds(run)
    assert kinds.count("cleanup.completed") == 1
    # After the pass that finished it, with how many rows the run had.
    assert kinds.index("cleanup.completed") > max(i for i, k in enumerate(kinds) if k == "cleanup.swept")
    assert run.log.get(kind="cleanup.completed").detail == {"resources": 2}


def test_waiving_the_last_unresolved_row_completes_the_cleanup_once():
    registry.register_action(FakeAction(revert=Scripted(DOWN)))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    with override_settings(EVENT_REVERT_MAX_ATTEMPTS=1):
        sweep()
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.INCOMPLETE

    first, second = Resource.objects.filter(run=run).order_by("id")
    waive([first], "the shard was wiped", "ops")
    assert "cleanup.completed" not in log_kinds(run)
    waive([second], "the shard was wiped", "ops")
    waive([second], "again", "ops")  # already resolved: nothing changes

    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE
    assert log_kinds(run).count("cleanup.completed") == 1


def test_a_run_that_took_nothing_logs_no_completion():
    run = make_run()
    make_step(run)
    sweep()
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.NOT_REQUIRED
    assert "cleanup.completed" not in log_kinds(run)


def test_the_feed_and_the_admin_log_filter_take_the_completed_kind():
    registry.register_action(FakeAction(revert=Scripted(GIVEN_BACK)))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    sweep()
    console = api_as("view_runlog", "view_moduleevent", "view_run")
    answer = console.get(f"{API}changes/", {"run": run.pk, "kind": "cleanup.completed,cleanup.gave_up"})
    assert answer.status_code == 200
    assert [(e["kind"], e["detail"]) for e in answer.json()] == [("cleanup.completed", {"resources": 1})]
    assert "cleanup.completed" in dict(LogKindFilter.lookups(None, None, None))
