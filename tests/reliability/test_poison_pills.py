"""Poison pills: a revert that raises, one that kills its process, one that never answers."""

import time

from cleanup.models import Resource, ResourceState, Run
from tests.reliability.harness import CLAIM_TIMEOUT_S, MAX_ATTEMPTS, PG_PROCESSES, drive_until_settled
from tests.reliability.ledger import run_of_steps

pytestmark = PG_PROCESSES


def rows_of(prefix):
    return list(Resource.objects.filter(ref__startswith=f"{prefix}-"))


def test_it_fails_a_pill_that_raises_or_kills_after_the_attempt_bound_and_gives_back_the_rest(workers):
    run = run_of_steps(["raise", "kill", "orc", "orc", "orc", "orc"], rows=2)

    drive_until_settled(workers, timeout=90, concurrency=2)

    per_ref = workers.calls_per_ref()
    for row in rows_of("raise") + rows_of("kill"):
        # An attempt is spent by a call: a call marked with others of its wave when a
        # wave-mate killed the process gets its attempt back (it may never have started)
        # and is next called alone, where its call spends it. So calls are never fewer
        # than attempts, and at most one more per attempt. A group whose sweepers keep
        # dying is worked alone, so the last attempt is its own call and its own error
        # is what a person reads.
        calls = per_ref[row.ref]
        assert MAX_ATTEMPTS <= calls <= 2 * MAX_ATTEMPTS, f"{row.ref} was called {calls} times"
        assert (row.state, row.revert_attempts) == (ResourceState.FAILED, MAX_ATTEMPTS)
    assert {r.last_error for r in rows_of("raise")} == {"rel.spawn raised RuntimeError: poison: the shard blew up"}
    assert all(r.last_error for r in rows_of("kill")), "a pill that killed its sweeper failed without a reason"
    assert {r.state for r in rows_of("orc")} == {ResourceState.REVERTED}
    assert Run.objects.get(pk=run.pk).cleanup_status == "incomplete"
    assert workers.overlaps() == []

    calls = len(workers.read_calls())
    assert workers.wait(workers.sweeper(), timeout=60) == 0
    assert len(workers.read_calls()) == calls, "a failed pill was claimed again automatically"


def test_it_never_calls_a_hanging_pill_again_while_its_call_still_runs(workers):
    run = run_of_steps(["hang", "orc", "orc"], rows=1)
    hang = rows_of("hang")[0]

    def hang_calls():
        return workers.calls_per_ref().get(hang.ref, 0)

    # Each sweeper is killed once its hanging call has outlived its budget and its claim,
    # as django-q2's task timeout would; the next one may take the claim over.
    for _ in range(MAX_ATTEMPTS):
        seen = hang_calls()
        proc = workers.sweeper("--forever")
        workers.wait_until(
            lambda seen=seen: hang_calls() > seen,
            timeout=CLAIM_TIMEOUT_S + 15,
            what="the next call of the hanging pill",
        )
        time.sleep(CLAIM_TIMEOUT_S + 1.5)
        assert workers.overlaps() == [], "the hanging pill was called again while its call still ran"
        proc.kill()
        workers.wait(proc)
    drive_until_settled(workers, timeout=60)

    assert workers.overlaps() == []
    assert hang_calls() == MAX_ATTEMPTS
    hang.refresh_from_db()
    assert (hang.state, hang.revert_attempts) == (ResourceState.FAILED, MAX_ATTEMPTS)
    assert hang.last_error
    assert {r.state for r in rows_of("orc")} == {ResourceState.REVERTED}
    assert Run.objects.get(pk=run.pk).cleanup_status == "incomplete"
