"""The run log tells the truth about stale sweepers and claims that died at the attempt bound."""

import json

from cleanup.models import Resource, RunLog
from tests.reliability.harness import MAX_ATTEMPTS, PG_PROCESSES, drive_until_settled, resume, stop_then_take_over
from tests.reliability.ledger import ended_runs, run_of_steps

pytestmark = PG_PROCESSES


def test_it_logs_what_stale_sweepers_and_dead_claims_really_did(workers):
    ended_runs(runs=1, steps=1, rows=2)
    stale = stop_then_take_over(workers, RELIABILITY_ANSWER="error")
    resume(workers, stale)
    dead = run_of_steps(["kill"], rows=1, attempts=MAX_ATTEMPTS - 1)
    drive_until_settled(workers, timeout=60)

    for entry in RunLog.objects.filter(kind="cleanup.swept"):
        outcomes = sum(v for k, v in entry.detail.items() if k not in ("attempted", "remaining") and type(v) is int)
        assert outcomes == entry.detail["attempted"], f"a pass logged attempts without their outcome: {entry.detail}"
    killer = Resource.objects.get(run=dead)
    assert killer.state == "failed"
    failures = [json.dumps(e.detail) for e in dead.log.filter(kind="cleanup.failed")]
    assert any(killer.ref in f for f in failures), "a row failed at the bound after a dead claim was not logged"
