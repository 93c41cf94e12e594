"""Two sweeper processes on one database, one with its clock 90 s off (issue 41, item 7):
no call starts while another holds one of its refs, no ref is given back twice, no row is
lost (rule 9: "whatever their clocks say").

The skewed sweeper runs under Debian's libfaketime (`harness.faketime`, which leaves
CLOCK_MONOTONIC real: see there why). Scaled down from the issue's 20 s claims and 6 s
reverts to 8 s claims and 3 s reverts; 90 s of skew is still ten claims long, so a claim
stamped or judged on a worker's clock is taken over while its call runs.
"""

import time

import pytest

from cleanup.models import Resource, ResourceState
from tests.reliability.harness import MAX_ATTEMPTS, PG_PROCESSES, faketime, settled
from tests.reliability.ledger import ended_runs

pytestmark = PG_PROCESSES

SKEW_S = 90
CLAIM_S = 8
REVERT_S = 3
RUNS = 24
ROWS = 4


@pytest.mark.parametrize("offset", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
def test_two_sweepers_with_clocks_90_s_apart_never_call_one_ref_twice_at_once(workers, offset):
    ended_runs(runs=RUNS, steps=1, rows=ROWS)
    env = dict(
        EVENT_CLAIM_TIMEOUT_S=CLAIM_S,
        EVENT_DEFAULT_BUDGET_MS=(REVERT_S + 2) * 1000,
        # Four groups a pass, one wave of calls: every claim is called at once, so a claim
        # lasts one call (3 s) on any true clock, well inside its 8 s.
        EVENT_CLEANUP_RUN_BATCH=4,
        RELIABILITY_DELAY=REVERT_S,
    )
    wrap, skewed_env = faketime(offset)
    # They begin together once both have started up; the skewed one reads the moment on its own clock.
    start_at = time.time() + 6
    true = workers.sweeper("--forever", "--start-at", str(start_at), **env)
    skewed = workers.sweeper("--forever", "--start-at", str(start_at + offset), wrap=wrap, **env, **skewed_env)

    workers.wait_until(settled, timeout=120, what="the sweep to settle")
    for proc in (true, skewed):
        assert workers.alive(proc), workers.output(proc)

    calls = [c for c in workers.read_calls() if c["verb"] == "revert"]
    pids = {c["pid"] for c in calls}
    twice = workers.given_back_twice()
    rows = list(Resource.objects.all())
    lost = [(r.ref, r.state) for r in rows if r.state not in (ResourceState.REVERTED, ResourceState.FAILED)]
    silent = [r.ref for r in rows if r.state == ResourceState.FAILED and not r.last_error]
    print(
        f"skew {offset:+d} s: {len(calls)} revert calls by {len(pids)} processes, "
        f"overlaps {len(workers.overlaps())}, refs given back twice {len(twice)}, "
        f"failed {sum(r.state == ResourceState.FAILED for r in rows)}, lost {len(lost)}"
    )
    assert len(pids) == 2, "both sweepers must take part, or the skew proves nothing"
    assert workers.overlaps() == [], "a call started while another held one of its refs"
    assert twice == [], f"{len(twice)} refs given back twice"
    assert lost == [] and silent == [], "rows left unresolved, or failed without a reason"
    assert max(r.revert_attempts for r in rows) <= MAX_ATTEMPTS
