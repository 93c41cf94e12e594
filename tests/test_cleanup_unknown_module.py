"""A group no registered module can give back fails terminally, with a reason."""

import pytest
from django.test import override_settings

from cleanup import registry
from cleanup.models import CleanupStatus, Resource
from cleanup.sweep import sweep
from tests.fakes import FakeAction, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


@override_settings(EVENT_REVERT_BACKOFF_S=0)
def test_rows_of_an_unregistered_action_fail_once_naming_the_action():
    run = make_run()
    make_rows(make_step(run, action_id="gone.spawn"), ["orc-1"])

    sweep()
    sweep()

    rows = Resource.objects.filter(run=run)
    assert {(r.state, r.revert_attempts, r.retryable) for r in rows} == {("failed", 1, False)}
    assert all('"gone.spawn"' in r.last_error for r in rows)
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.INCOMPLETE


@override_settings(EVENT_REVERT_BACKOFF_S=0)
def test_a_lease_no_module_registers_fails_once_naming_the_lease():
    run = make_run()
    row = make_lease_row(run, lease_id="gone.rate", target="camp")

    sweep()
    sweep()

    row.refresh_from_db()
    assert (row.state, row.revert_attempts, row.retryable) == ("failed", 1, False)
    assert '"gone.rate#camp"' in row.last_error


def test_an_uninstalled_module_is_treated_as_unregistered():
    registry.register_action(FakeAction(id="test.spawn", module="test"))
    registry.unregister_module("test")
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    sweep()
    assert 'no module registers the action "test.spawn"' in Resource.objects.get().last_error


def test_an_action_without_revert_fails_terminally():
    registry.register_action(FakeAction(revert=None))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    sweep()
    row = Resource.objects.get()
    assert (row.state, row.retryable) == ("failed", False)
    assert "declares no revert()" in row.last_error


def test_retry_false_is_not_retried_automatically():
    from tests.fakes import Scripted

    revert = Scripted({"ok": False, "error": "creature is a quest NPC now", "retry": False})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    with override_settings(EVENT_REVERT_BACKOFF_S=0):
        sweep()
        sweep()
    assert len(revert.calls) == 1
    row = Resource.objects.get()
    assert (row.state, row.retryable, row.last_error) == ("failed", False, "creature is a quest NPC now")
