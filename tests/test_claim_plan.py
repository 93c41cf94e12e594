"""The claim's plan: the runs it locked and the groups it chose are each read once, however
stale the planner's statistics of the ledger.

The claim holds its runs' locks until it ends, and the other sweepers skip those runs
(``SKIP LOCKED``): a claim that reads a CTE again for every unresolved row of the ledger
holds them for as long, and sweepers that start together find every run taken.
"""

import json
import re
import uuid

import pytest
from django.db import connection
from psycopg import sql as psql

from cleanup.models import Resource, ResourceState
from cleanup.sweep import statements
from tests.reliability.ledger import ended_runs

CEILING = 3
RUNS_PER_CLAIM = 10


def stale_ledger():
    """A ledger mostly given back when the planner last looked (ANALYZE), then a burst of
    ended runs it has not seen: on a site with history, autovacuum waits for a tenth of
    the table to change before it looks again. Answers the new runs' ids."""
    ended_runs(runs=200, steps=1, rows=20, prefix="old")
    Resource.objects.update(state=ResourceState.REVERTED)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE cleanup_resource")
        cursor.execute("ANALYZE cleanup_run")
    return [run.pk for run in ended_runs(runs=60, steps=2, rows=20, prefix="new")]


def claim_sent(run_ids, monkeypatch):
    """The claim's SQL and params, as the pass would send them."""
    sent = {}

    def capture(sql, params, rows=True):
        sent.update(sql=sql, params=params)
        return []

    monkeypatch.setattr(statements, "fetch_prepared", capture)
    statements.claim(
        run_ids,
        uuid.uuid4(),
        CEILING,
        skip_locked=True,
        limit=RUNS_PER_CLAIM,
        per_run=25,
        down=[],
        canaries=[],
    )
    return sent["sql"], sent["params"]


def explain_analyze_generic(sql, params):
    """EXPLAIN ANALYZE of the statement on its generic plan, as a prepared statement runs."""
    numbered = iter(range(1, len(params) + 1))
    text = re.sub("%%|%s", lambda m: "%" if m.group(0) == "%%" else f"${next(numbered)}", sql)
    raw = connection.connection
    with raw.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE claim_plan AS {text}")
        try:
            literals = psql.SQL(", ").join(psql.Literal(v) for v in params).as_string(raw)
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_plan({literals})")
            (plan,) = cursor.fetchone()
        finally:
            cursor.execute("DEALLOCATE claim_plan")
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def describe(node):
    return f"{node['Node Type']} on {node.get('CTE Name') or node.get('Relation Name')} x{node['Actual Loops']}"


@pytest.mark.django_db
def test_the_claim_reads_its_runs_and_chosen_groups_once_on_a_stale_ledger(monkeypatch):
    new_runs = stale_ledger()
    run_ids = new_runs[:RUNS_PER_CLAIM]

    plan = explain_analyze_generic(*claim_sent(run_ids, monkeypatch))

    # The claim did its work: every row of the ten runs (two groups each, both under the
    # per-run bound).
    (update,) = [n for n in nodes(plan) if n["Node Type"] == "ModifyTable"]
    assert update["Actual Rows"] == RUNS_PER_CLAIM * 2 * 20
    claimed = Resource.objects.filter(state=ResourceState.REVERTING)
    assert set(claimed.values_list("run_id", flat=True)) == set(run_ids)
    # A CTE read again per row (the inner side of a nested loop, or a subplan that is
    # not hashed) is what held the runs' locks for as long as the ledger is unresolved.
    again = [describe(n) for n in nodes(plan) if n["Node Type"] == "CTE Scan" and n["Actual Loops"] > 1]
    assert again == [], f"CTEs read again per row: {again}"
    # The rows the UPDATE reads are looked up in the chosen groups' sets, never joined to them.
    joins = [describe(n) for n in nodes(update) if "Join" in n["Node Type"] or n["Node Type"] == "Nested Loop"]
    assert joins == [], f"the UPDATE joins: {joins}"
