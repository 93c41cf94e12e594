"""An attempt is spent by a call that was made (rule 20): a call that kills its own process
takes down the calls of its wave that had not started yet, and those get their attempt back."""

from cleanup import rows as ledger_rows
from cleanup.models import Attempt, Resource, ResourceState
from tests.reliability.harness import MAX_ATTEMPTS, PG_PROCESSES, drive_until_settled
from tests.reliability.ledger import run_of_steps

pytestmark = PG_PROCESSES


def test_no_group_has_more_attempts_than_calls_when_calls_kill_their_process(workers):
    # One group in two is poisoned; the others share waves of calls with the pills.
    runs = [run_of_steps(["kill", "orc", "raise", "orc", "kill", "orc", "orc", "orc"]) for _ in range(4)]

    drive_until_settled(workers, timeout=150, concurrency=2)

    per_ref = workers.calls_per_ref()
    rows = list(Resource.objects.filter(run__in=runs))
    assert len(rows) == 32
    calls = {r.ref: per_ref.get(r.ref, 0) for r in rows}
    more = [(r.ref, r.revert_attempts, calls[r.ref]) for r in rows if r.revert_attempts > calls[r.ref]]
    assert more == [], "attempts spent without a call (ref, attempts, calls)"
    numbered = {}
    for row in rows:
        # The history as staff read it: the attempts recorded, and the give-back the row records.
        for attempt in ledger_rows.history(row, Attempt.objects.filter(resource=row)):
            numbered[row.ref] = max(attempt.number, numbered.get(row.ref, 0))
    past = [(ref, n, per_ref.get(ref, 0)) for ref, n in numbered.items() if n > per_ref.get(ref, 0)]
    assert past == [], "the attempt history numbers an attempt no call made (ref, number, calls)"
    for row in rows:
        if row.ref.startswith(("kill-", "raise-")):
            # Bounded all the same: a pill that kills its process is called alone at last,
            # and each of those calls is spent.
            assert (row.state, row.revert_attempts) == (ResourceState.FAILED, MAX_ATTEMPTS), row.ref
        else:
            assert row.state == ResourceState.REVERTED, (row.ref, row.state, row.last_error)
    assert workers.overlaps() == []
