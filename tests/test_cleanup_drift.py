"""Drifted rows: left alone, surfaced with the value found, not retried automatically."""

import pytest
from django.test import override_settings

from cleanup import registry
from cleanup.models import CleanupStatus
from cleanup.sweep import sweep
from tests.fakes import FakeLease, make_lease_row, make_run

pytestmark = pytest.mark.django_db


@override_settings(EVENT_REVERT_BACKOFF_S=0)
def test_it_leaves_a_drifted_lease_alone_and_shows_the_current_value():
    lease = registry.register_lease(FakeLease(values={"camp": 9}))
    run = make_run()
    row = make_lease_row(run, baseline=1, applied=5)

    sweep()
    sweep()
    sweep()

    assert len(lease.restores) == 1, "a drifted row was retried automatically"
    assert lease.values["camp"] == 9, "somebody else's value was overwritten"
    row.refresh_from_db()
    assert row.state == "drifted"
    assert "9" in row.last_error
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.INCOMPLETE
    failed = run.log.get(kind="cleanup.failed")
    assert failed.detail["outcome"] == "drifted"
    assert failed.detail["current"] == 9
