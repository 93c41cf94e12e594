"""Four sweeper processes over 2,000 rows in 200 runs: no overlap, all given back, status true."""

import time

from cleanup.models import Resource, Run
from tests.reliability.harness import MAX_ATTEMPTS, PG_PROCESSES, status_disagreements
from tests.reliability.ledger import ended_runs

pytestmark = PG_PROCESSES


def test_it_gives_back_2000_rows_with_four_sweepers_and_no_two_calls_at_once_for_a_ref(workers):
    ended_runs(runs=200, steps=1, rows=10)
    assert Resource.objects.count() == 2000

    # They begin together once all four have started up (Django's start-up on a loaded
    # machine can take longer than a batched sweeper needs for the whole ledger).
    start_at = str(time.time() + 8)
    sweepers = [workers.sweeper("--start-at", start_at, RELIABILITY_DELAY="0.05") for _ in range(4)]
    for proc in sweepers:
        assert workers.wait(proc, timeout=150) == 0, workers.output(proc)

    assert workers.overlaps() == []
    calls = workers.read_calls()
    assert len({c["pid"] for c in calls}) == 4, "the four sweepers did not all take part"
    per_ref = workers.calls_per_ref()
    assert set(per_ref) == set(Resource.objects.values_list("ref", flat=True)), "a row was never given back"
    assert max(per_ref.values()) <= MAX_ATTEMPTS
    assert set(Resource.objects.values_list("state", flat=True)) == {"reverted"}
    assert status_disagreements() == []
    assert set(Run.objects.values_list("cleanup_status", flat=True)) == {"complete"}
