"""The statements every pass sends, compiled once and bound per pass: finding and claiming
work, and counting a batch's rows for its runs' statuses.

Every pass sends them, so building them through the ORM each time would cost more than
running them. The rules themselves stay written once, as the row owner's predicates
(`cleanup.rows`: claimable, owing, suspect, keeps a run pending): their WHERE clauses are
compiled here once per database and attempt ceiling, with a stand-in for "now" that `bind`
replaces. Lists of ids travel as one array (``= ANY(%s)``). They are sent as prepared
statements (`cleanup.sql`).
May import: the models, `cleanup.rows`, `cleanup.sql`.
"""

import functools
from datetime import UTC, datetime

from django.db import connection

from .. import rows
from ..models import LEASE_KIND, TERMINAL, UNRESOLVED, Resource, ResourceState, Run, Step
from ..sql import fetch_prepared

# Stands for "now" in the compiled clauses; `bind` puts the pass's time in its place.
_SENTINEL = datetime(2000, 1, 1, tzinfo=UTC)


def bind(params, now):
    """The params of a compiled statement, with the pass's time for the stand-in."""
    sentinel = connection.ops.adapt_datetimefield_value(_SENTINEL)
    at = connection.ops.adapt_datetimefield_value(now)
    return [at if p == sentinel else p for p in params]


def in_list(column, values):
    """``column`` is one of ``values``: SQL and params (one array)."""
    return f"{column} = ANY(%s)", [list(values)]


def where(queryset):
    """The WHERE clause of a one-table queryset, as SQL and params.

    On PostgreSQL its constants are written into the SQL as literals, all but the stand-in
    for "now": a prepared statement is planned once for any value of its parameters, and
    only a literal lets the planner match a partial index whose predicate names it (the
    finder's skip scan of ``finder_owing_run_idx``, for one).
    """
    query = queryset.query
    sql, params = query.get_compiler(connection=connection).compile(query.where)
    sentinel = connection.ops.adapt_datetimefield_value(_SENTINEL)
    pieces, kept = sql.split("%s"), []
    if len(pieces) != len(params) + 1:  # a literal "%s" in the clause: leave it as it is
        return sql, tuple(params)
    out = [pieces[0]]
    for param, piece in zip(params, pieces[1:], strict=True):
        if param == sentinel:
            out.append("%s")
            kept.append(param)
        else:
            out.append(connection.ops.compose_sql("%s", [param]).replace("%", "%%"))
        out.append(piece)
    return "".join(out), tuple(kept)


def names():
    quote = connection.ops.quote_name
    return quote(Resource._meta.db_table), quote(Run._meta.db_table), quote(Step._meta.db_table)


@functools.lru_cache(maxsize=16)
def claimable(alias, max_attempts):
    """`rows.claimable` as a WHERE clause on the resource table, "now" unbound."""
    return where(Resource.objects.filter(rows.claimable(_SENTINEL, max_attempts)))


@functools.lru_cache(maxsize=16)
def suspect(alias):
    return where(Resource.objects.filter(rows.suspect()))


@functools.lru_cache(maxsize=16)
def finder(alias, max_attempts):
    """The finder's skip scan of ``finder_owing_run_idx``; params end with the limit.

    The run's own conditions are a subquery per owing run, not a join, so the scan stops
    at the limit instead of walking every run that owes something (a join may be hashed).
    """
    owing_sql, owing_params = where(Resource.objects.filter(rows.owing()))
    claimable_sql, claimable_params = claimable(alias, max_attempts)
    resource, run, _ = names()
    statuses = ", ".join(["%s"] * len(TERMINAL))
    sql = f"""
        WITH RECURSIVE owing(run_id) AS (
            SELECT MIN(run_id) FROM {resource} WHERE {owing_sql}
            UNION ALL
            SELECT (SELECT MIN(run_id) FROM {resource} WHERE {owing_sql} AND {resource}.run_id > owing.run_id)
            FROM owing WHERE owing.run_id IS NOT NULL
        )
        SELECT owing.run_id FROM owing
        WHERE (SELECT {run}.status IN ({statuses}) AND {run}.auto_cleanup FROM {run} WHERE {run}.id = owing.run_id)
          AND EXISTS (SELECT 1 FROM {resource} WHERE {resource}.run_id = owing.run_id AND {claimable_sql})
        LIMIT %s
    """
    return sql, (*owing_params, *owing_params, *[str(s) for s in TERMINAL], *claimable_params)


def take_runs(run_ids, now, max_attempts, skip_locked, limit):
    """Terminal runs among ``run_ids`` with rows to claim now, oldest first, locked."""
    resource, run, _ = names()
    claimable_sql, claimable_params = claimable(connection.alias, max_attempts)
    ids_sql, ids_params = in_list(f"{run}.id", run_ids)
    statuses = ", ".join(["%s"] * len(TERMINAL))
    sql = (
        f"SELECT {run}.id FROM {run} WHERE {ids_sql} AND {run}.status IN ({statuses}) "
        f"AND EXISTS (SELECT 1 FROM {resource} WHERE {resource}.run_id = {run}.id AND {claimable_sql}) "
        f"ORDER BY {run}.id"
    )
    params = [*ids_params, *[str(s) for s in TERMINAL], *bind(claimable_params, now)]
    if limit:
        sql += " LIMIT %s"
        params.append(limit)
    sql += " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"
    rows.taking(rows.RUNS)
    return [run_id for (run_id,) in fetch_prepared(sql, params)]


# What `plan` reads of each claimable group: one row per group, in ledger order.
HEAD_COLUMNS = (
    "run_id",
    "step_id",
    "alone",
    "action_id",
    "step_key",
    "module",
    "backend",
    "first",
    "lease",
    "suspect",
)


def heads(run_ids, now, max_attempts):
    """One row per claimable group of ``run_ids`` (`HEAD_COLUMNS`), by run and ledger order.

    A lease row and a loose row (no step) are groups of their own (``alone`` is their
    id); a step's other rows are one group per backend that holds them. ``suspect``: a
    row of the group was taken over from a sweeper that died holding it after an earlier
    attempt.
    """
    resource, _, step = names()
    claimable_sql, claimable_params = claimable(connection.alias, max_attempts)
    suspect_sql, suspect_params = suspect(connection.alias)
    ids_sql, ids_params = in_list(f"{resource}.run_id", run_ids)
    r = resource
    alone = f"CASE WHEN ({r}.kind = %s OR {r}.step_id IS NULL) THEN {r}.id ELSE 0 END"
    sql = (
        f"SELECT {r}.run_id, {r}.step_id, {alone}, {step}.action_id, {step}.idempotency_key, {r}.module, {r}.backend, "
        f"MIN({r}.id) AS first, MAX(CASE WHEN {r}.kind = %s THEN 1 ELSE 0 END), "
        f"MAX(CASE WHEN ({suspect_sql}) THEN 1 ELSE 0 END) "
        f"FROM {r} LEFT OUTER JOIN {step} ON {step}.id = {r}.step_id "
        f"WHERE {ids_sql} AND {claimable_sql} "
        f"GROUP BY {r}.run_id, {r}.step_id, 3, {step}.action_id, {step}.idempotency_key, {r}.module, {r}.backend "
        f"ORDER BY {r}.run_id, first"
    )
    params = [LEASE_KIND, LEASE_KIND, *suspect_params, *ids_params, *bind(claimable_params, now)]
    return [dict(zip(HEAD_COLUMNS, values, strict=True)) for values in fetch_prepared(sql, params)]


def in_pairs(columns, pairs):
    """``(a, b)`` is one of ``pairs``: SQL and params (two arrays on PostgreSQL)."""
    pairs = list(pairs)
    firsts, seconds = [p[0] for p in pairs], [p[1] for p in pairs]
    return f"({columns[0]}, {columns[1]}) IN (SELECT * FROM unnest(%s::bigint[], %s::varchar[]))", [firsts, seconds]


def claim_rows(run_ids, steps, alone, now, max_attempts):
    """The WHERE clause (SQL, params) of the rows a claim takes: the step groups' rows but
    their leases (``steps``: ``(step id, backend)`` pairs), the lease and loose rows by
    id, all still claimable."""
    resource, _, _ = names()
    claimable_sql, claimable_params = claimable(connection.alias, max_attempts)
    runs_sql, runs_params = in_list(f"{resource}.run_id", run_ids)
    ids_sql, ids_params = in_list(f"{resource}.id", alone)
    steps_sql, steps_params = in_pairs((f"{resource}.step_id", f"{resource}.backend"), steps)
    sql = f"{runs_sql} AND ({ids_sql} OR ({steps_sql} AND NOT ({resource}.kind = %s))) AND {claimable_sql}"
    return sql, [*runs_params, *ids_params, *steps_params, LEASE_KIND, *bind(claimable_params, now)]


def called_rows(token, steps, alone):
    """The WHERE clause of the rows of a claim's groups (``steps``: ``(step id, backend)``
    pairs, ``alone``: row ids), still held by ``token``."""
    resource, _, _ = names()
    ids_sql, ids_params = in_list(f"{resource}.id", alone)
    steps_sql, steps_params = in_pairs((f"{resource}.step_id", f"{resource}.backend"), steps)
    # The state is a literal, not a parameter: a prepared statement's one plan can then
    # read the claimed rows through the partial index of rows being reverted
    # (`res_reverting_idx`) instead of the whole ledger.
    sql = (
        f"{resource}.claim_token = %s AND {resource}.state = '{ResourceState.REVERTING.value}' "
        f"AND ({ids_sql} OR ({steps_sql} AND NOT ({resource}.kind = '{LEASE_KIND}')))"
    )
    token_param = Resource._meta.get_field("claim_token").get_db_prep_value(token, connection)
    return sql, [token_param, *ids_params, *steps_params]


@functools.lru_cache(maxsize=16)
def _status_counts(alias, max_attempts):
    unresolved_sql, unresolved_params = where(Resource.objects.filter(state__in=UNRESOLVED))
    retryable_sql, retryable_params = where(Resource.objects.filter(rows.keeps_run_pending(max_attempts)))
    resource, _, _ = names()
    sql = (
        f"SELECT {resource}.run_id, COUNT(*), SUM(CASE WHEN {unresolved_sql} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN {retryable_sql} THEN 1 ELSE 0 END) FROM {resource} WHERE {{runs}} GROUP BY {resource}.run_id"
    )
    return sql, (*unresolved_params, *retryable_params)


def status_counts(run_ids, max_attempts):
    """Per run of ``run_ids``: its rows, its unresolved rows, and the rows the sweep will
    still try (`rows.keeps_run_pending`). Runs without rows are absent."""
    sql, params = _status_counts(connection.alias, max_attempts)
    resource, _, _ = names()
    runs_sql, runs_params = in_list(f"{resource}.run_id", run_ids)
    return {
        run_id: {"total": total, "unresolved": unresolved, "retryable": retryable}
        for run_id, total, unresolved, retryable in fetch_prepared(
            sql.replace("{runs}", runs_sql), [*params, *runs_params]
        )
    }
