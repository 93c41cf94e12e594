"""`pg_terminate_backend` on a sweeper mid-pass: the pass goes on, the lost group comes back."""

import time

from django.db import connection

from cleanup.models import Resource, ResourceState
from tests.reliability.harness import CLAIM_TIMEOUT_S, PG_PROCESSES, settled, status_disagreements
from tests.reliability.ledger import ended_runs

pytestmark = PG_PROCESSES


def test_it_goes_on_with_the_other_groups_and_recovers_the_lost_one(workers):
    ended_runs(runs=3, steps=3, rows=1)
    sweeper = workers.sweeper("--forever", RELIABILITY_DELAY="0.5")
    workers.wait_until(lambda: workers.read_calls(), timeout=60, what="the sweeper's first call")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchall(), "no sweeper connection to terminate"
    terminated_at = time.time()
    lost = workers.read_calls()[0]["refs"]

    workers.wait_until(settled, timeout=CLAIM_TIMEOUT_S + 60, what="the lost group to be given back")

    assert workers.alive(sweeper), "the sweeper died with its connection"
    later = [c for c in workers.read_calls() if c["start"] > terminated_at]
    assert {ref for c in later for ref in c["refs"]} - set(lost), "the pass did not go on with other groups"
    assert set(Resource.objects.values_list("state", flat=True)) == {ResourceState.REVERTED}
    assert workers.overlaps() == []
    assert status_disagreements() == []
