"""`kill -9` of sweepers at chosen points of a pass: nothing lost, nothing overlapped, bounded, status true."""

import itertools

from cleanup.models import Resource, ResourceState, Run
from tests.reliability.harness import MAX_ATTEMPTS, PG_PROCESSES, drive_until_settled, status_disagreements
from tests.reliability.ledger import ended_runs

pytestmark = PG_PROCESSES

# Each halt kills its sweeper the N-th time it reaches the point.
BEFORE_THE_VERDICT = [
    f"kill:{point}:{n}"
    for n, point in itertools.product((1, 2, 3, 1, 2, 3, 1, 2), ("before_call", "during_call", "after_answer"))
]


def test_it_gives_back_every_row_through_kill_9_at_24_points(workers, monkeypatch):
    # One run per pass: a pass claims a whole batch of runs at once, and 24 kills must
    # land before the work runs out.
    monkeypatch.setenv("EVENT_CLEANUP_RUN_BATCH", "1")
    ended_runs(runs=40, steps=4, rows=2)

    killed = drive_until_settled(workers, timeout=120, halts=BEFORE_THE_VERDICT, concurrency=4)

    assert len(killed) >= 20, f"only {len(killed)} sweepers were killed: {killed}"
    assert {h.split(":")[1] for h in killed} == {"before_call", "during_call", "after_answer"}
    assert workers.overlaps() == []
    rows = list(Resource.objects.all())
    assert {r.state for r in rows} <= {ResourceState.REVERTED, ResourceState.FAILED}
    assert all(r.last_error for r in rows if r.state == ResourceState.FAILED), "a row failed without its reason"
    assert max(r.revert_attempts for r in rows) <= MAX_ATTEMPTS
    # A call marked with others of its wave whose sweeper was killed gets its attempt back
    # (it may not have started) and is called alone next: at most one call more than
    # attempts for each such kill (rule 20).
    assert max(workers.calls_per_ref().values()) <= 2 * MAX_ATTEMPTS
    assert status_disagreements() == []


def test_it_makes_a_run_status_true_again_after_a_kill_between_verdict_and_status(workers, monkeypatch):
    monkeypatch.setenv("EVENT_CLEANUP_RUN_BATCH", "1")  # a verdict per run, so a kill after each
    given_back = ended_runs(runs=1, steps=1, rows=2)[0]
    # The last attempt of a group the shard refuses: its verdict fails the rows at the ceiling.
    at_ceiling = ended_runs(runs=1, steps=1, rows=2, prefix="fail", attempts=MAX_ATTEMPTS - 1)[0]

    killed = drive_until_settled(workers, timeout=60, halts=["kill:after_verdict:1", "kill:after_verdict:1"])

    assert killed == ["kill:after_verdict:1", "kill:after_verdict:1"]
    assert set(Resource.objects.filter(run=given_back).values_list("state", flat=True)) == {"reverted"}
    assert set(Resource.objects.filter(run=at_ceiling).values_list("state", flat=True)) == {"failed"}
    # A later pass, by a sweeper that is not killed, makes every status true.
    assert workers.wait(workers.sweeper(), timeout=60) == 0
    assert status_disagreements() == []
    assert Run.objects.get(pk=given_back.pk).cleanup_status == "complete"
    assert Run.objects.get(pk=at_ceiling.pk).cleanup_status == "incomplete"
