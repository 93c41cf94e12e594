"""A sweeper stopped past its claim timeout, then resumed: its stale verdict changes nothing."""

import json

from cleanup.models import Resource, ResourceState, Run, RunStatus
from tests.reliability.harness import PG_PROCESSES, resume, stop_then_take_over
from tests.reliability.ledger import ended_runs, lease_row

pytestmark = PG_PROCESSES


def test_it_lets_no_stale_verdict_overwrite_the_rows_of_a_newer_claim(workers):
    run = ended_runs(runs=1, steps=1, rows=2)[0]

    stale = stop_then_take_over(workers, RELIABILITY_ANSWER="error")
    taken_over = set(Resource.objects.values_list("state", "revert_attempts", "last_error"))
    assert taken_over == {(ResourceState.REVERTED, 2, "")}
    resume(workers, stale)

    assert set(Resource.objects.values_list("state", "revert_attempts", "last_error")) == taken_over
    assert not run.log.filter(kind="cleanup.failed").exists()
    assert Run.objects.get(pk=run.pk).cleanup_status == "complete"


def test_it_lets_no_stale_lease_restore_hand_its_baseline_down(workers):
    workers.store.write_text(json.dumps({"camp": 5}))
    first = ended_runs(runs=1, steps=0, rows=0)[0]
    lease_row(first, "camp", baseline=1, applied=5)

    stale = stop_then_take_over(workers)
    assert json.loads(workers.store.read_text()) == {"camp": 1}
    # A person sets the spawner to 2; then a new run leases it to 7.
    second = Run.objects.create(name="later raid", status=RunStatus.RUNNING)
    newer = lease_row(second, "camp", baseline=2, applied=7)
    workers.store.write_text(json.dumps({"camp": 7}))
    resume(workers, stale)

    newer.refresh_from_db()
    assert newer.payload["baseline"] == 2, "the stale restore handed its baseline down"
    Run.objects.filter(pk=second.pk).update(status=RunStatus.COMPLETED)
    assert workers.wait(workers.sweeper(), timeout=60) == 0
    assert json.loads(workers.store.read_text()) == {"camp": 2}
