"""A run whose only row is a lease is cleaned: work is found from rows, not from a flag."""

import pytest

from cleanup import registry
from cleanup.models import CleanupStatus, Resource
from cleanup.sweep import sweep
from tests.fakes import FakeLease, log_kinds, make_lease_row, make_run

pytestmark = pytest.mark.django_db


def test_it_restores_a_lease_only_run_from_its_row_alone():
    lease = registry.register_lease(FakeLease(values={"camp": 5}))
    run = make_run(cleanup_status=CleanupStatus.NOT_REQUIRED)
    row = make_lease_row(run, baseline=1, applied=5)

    result = sweep()

    assert result.runs == 1
    assert lease.values["camp"] == 1
    assert lease.restores == [{"baseline": 1, "expected": 5, "run_id": run.pk, "target": "camp"}]
    row.refresh_from_db()
    assert row.state == "reverted"
    assert row.revert_attempts == 1
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE
    assert log_kinds(run) == ["cleanup.reverted", "cleanup.swept", "cleanup.completed"]


def test_it_leaves_a_terminal_run_without_rows_not_required():
    run = make_run()
    assert sweep().runs == 0
    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.NOT_REQUIRED
    assert not Resource.objects.exists()
