"""The statements every pass sends, compiled once and bound per pass: finding and claiming
work, and counting a batch's rows for its runs' statuses.

Every pass sends them, so building them through the ORM each time would cost more than
running them. The rules themselves stay written once, as the row owner's predicates
(`cleanup.rows`: claimable, owing, suspect, keeps a run pending): their WHERE clauses are
compiled here once per database and attempt ceiling. Their "now" is the database's clock,
read by the statement itself (`cleanup.clock`), never a time the worker sends: a worker
whose clock is off claims, takes over and waits exactly as the others do (rule 9). Lists
of ids travel as one array (``= ANY(%s)``). They are sent as prepared statements
(`cleanup.sql`).
May import: the models, `cleanup.rows`, `cleanup.sql`, `outages` (its predicate of a troubled backend).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, cast

from django.db import connection
from django.db.models import QuerySet

from .. import outages, rows
from ..models import LEASE_KIND, TERMINAL, UNRESOLVED, ModuleHealth, Resource, ResourceState, Run, Step
from ..sql import fetch_prepared


def in_list(column: str, values: Iterable[Any]) -> tuple[str, list[Any]]:
    """``column`` is one of ``values``: SQL and params (one array)."""
    return f"{column} = ANY(%s)", [list(values)]


def where(queryset: QuerySet[Any]) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause of a one-table queryset, as SQL and params.

    On PostgreSQL its constants are written into the SQL as literals: a prepared statement
    is planned once for any value of its parameters, and only a literal lets the planner
    match a partial index whose predicate names it (the finder's skip scan of
    ``finder_owing_run_idx``, for one). "Now" is the database's own clock in the SQL.
    """
    query = queryset.query
    sql, params = query.get_compiler(connection=connection).compile(query.where)
    pieces = sql.split("%s")
    if len(pieces) != len(params) + 1:  # a literal "%s" in the clause: leave it as it is
        return sql, tuple(params)
    out = [pieces[0]]
    for param, piece in zip(params, pieces[1:], strict=True):
        out.append(cast(Any, connection.ops).compose_sql("%s", [param]).replace("%", "%%"))
        out.append(piece)
    return "".join(out), ()


def names() -> tuple[str, str, str]:
    quote = connection.ops.quote_name
    return quote(Resource._meta.db_table), quote(Run._meta.db_table), quote(Step._meta.db_table)


@functools.lru_cache(maxsize=16)
def claimable(alias: str, max_attempts: int) -> tuple[str, tuple[Any, ...]]:
    """`rows.claimable` as a WHERE clause on the resource table, on the database's clock."""
    return where(Resource.objects.filter(rows.claimable(None, max_attempts)))


@functools.lru_cache(maxsize=16)
def suspect(alias: str) -> tuple[str, tuple[Any, ...]]:
    return where(Resource.objects.filter(rows.suspect()))


@functools.lru_cache(maxsize=16)
def lone_suspect(alias: str) -> tuple[str, tuple[Any, ...]]:
    return where(Resource.objects.filter(rows.lone_suspect()))


@functools.lru_cache(maxsize=16)
def finder(alias: str, max_attempts: int) -> tuple[str, tuple[Any, ...]]:
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


@functools.lru_cache(maxsize=16)
def looking(alias: str, max_attempts: int) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    """What a pass reads before its work, in one query of one row: the runs the finder names
    (an array, in its order), whether a dead claim is to be released (`rows.spent_dead_claim`),
    and whether a backend is troubled (`outages.troubled`). The SQL, the finder's params
    (the limit follows them), then the rest; on the database's clock."""
    finder_sql, finder_params = finder(alias, max_attempts)
    spent_sql, spent_params = where(Resource.objects.filter(rows.spent_dead_claim(None, max_attempts)))
    troubled_sql, troubled_params = where(ModuleHealth.objects.filter(outages.troubled()))
    resource, _, _ = names()
    health = connection.ops.quote_name(ModuleHealth._meta.db_table)
    sql = (
        f"SELECT ARRAY(SELECT f.run_id FROM ({finder_sql}) AS f), "
        f"EXISTS (SELECT 1 FROM {resource} WHERE {spent_sql}), "
        f"EXISTS (SELECT 1 FROM {health} WHERE {troubled_sql})"
    )
    return sql, finder_params, (*spent_params, *troubled_params)


def look(limit: int, max_attempts: int) -> tuple[list[int], bool, bool]:
    """`looking`, sent: ``(run ids, a dead claim to release, a backend troubled)``."""
    sql, finder_params, rest = looking(connection.alias, max_attempts)
    ((found, spent, troubled),) = fetch_prepared(sql, [*finder_params, limit, *rest])
    return list(found or []), bool(spent), bool(troubled)


def _taking(run_ids: Sequence[int], max_attempts: int, skip_locked: bool, limit: int | None) -> tuple[str, list[Any]]:
    resource, run, _ = names()
    claimable_sql, claimable_params = claimable(connection.alias, max_attempts)
    ids_sql, ids_params = in_list(f"{run}.id", run_ids)
    statuses = ", ".join(["%s"] * len(TERMINAL))
    sql = (
        f"SELECT {run}.id FROM {run} WHERE {ids_sql} AND {run}.status IN ({statuses}) "
        f"AND EXISTS (SELECT 1 FROM {resource} WHERE {resource}.run_id = {run}.id AND {claimable_sql}) "
        f"ORDER BY {run}.id"
    )
    params = [*ids_params, *[str(s) for s in TERMINAL], *claimable_params]
    if limit:
        sql += " LIMIT %s"
        params.append(limit)
    sql += " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"
    return sql, params


# What the claim reads of each claimable group (`_heads`): one row per group, each group
# given back by one call (rule 3). A lease row and a loose row (no step) are groups of
# their own (``alone`` is their id); a step's other rows are one group per backend that
# holds them. ``suspect``: a row of the group was taken over from a sweeper that died
# holding it after an earlier attempt, or in a wave of calls (`rows.suspect`); ``lone``: one
# that must be worked alone (`rows.lone_suspect`).
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
    "lone",
)


def _heads(ids_sql: str, ids_params: Sequence[Any], max_attempts: int) -> tuple[str, list[Any]]:
    resource, _, step = names()
    claimable_sql, claimable_params = claimable(connection.alias, max_attempts)
    suspect_sql, suspect_params = suspect(connection.alias)
    lone_sql, lone_params = lone_suspect(connection.alias)
    r = resource
    alone = f"CASE WHEN ({r}.kind = %s OR {r}.step_id IS NULL) THEN {r}.id ELSE 0 END"
    sql = (
        f"SELECT {r}.run_id, {r}.step_id, {alone}, {step}.action_id, {step}.idempotency_key, {r}.module, {r}.backend, "
        f"MIN({r}.id) AS first, MAX(CASE WHEN {r}.kind = %s THEN 1 ELSE 0 END), "
        f"MAX(CASE WHEN ({suspect_sql}) THEN 1 ELSE 0 END), "
        f"MAX(CASE WHEN ({lone_sql}) THEN 1 ELSE 0 END) "
        f"FROM {r} LEFT OUTER JOIN {step} ON {step}.id = {r}.step_id "
        f"WHERE {ids_sql} AND {claimable_sql} "
        f"GROUP BY {r}.run_id, {r}.step_id, 3, {step}.action_id, {step}.idempotency_key, {r}.module, {r}.backend"
    )
    return sql, [LEASE_KIND, LEASE_KIND, *suspect_params, *lone_params, *ids_params, *claimable_params]


# What the pass's claim answers of each row it took (`rows.CLAIMED_COLUMNS`), then of the
# row's group, and of the statement: the runs it locked, whether it left work behind.
CLAIM_COLUMNS = (
    *rows.CLAIMED_COLUMNS,
    "group_kind",
    "group_key",
    "action_id",
    "step_key",
    "module",
    "nth",
    "taken",
    "work_left",
    "together",
)


def claim(
    run_ids: Sequence[int],
    token: uuid.UUID,
    max_attempts: int,
    *,
    skip_locked: bool,
    limit: int | None,
    per_run: int,
    down: Iterable[tuple[str, str]],
    canaries: Iterable[tuple[str, str]],
) -> list[tuple[Any, ...]]:
    """The pass's claim as one statement, in its own transaction: the runs locked
    (`_taking`), their groups read (`_heads`) and chosen, and the chosen groups' rows
    claimed (`rows.claiming`). Answers `CLAIM_COLUMNS`: a row for each row taken (its own
    columns), one for each group chosen (its run, step and backend, and the group's columns),
    and one of the statement's own (``taken``, ``work_left``, ``together``).

    The choice: groups of a backend in ``down`` wait, but for the first group of each
    backend in ``canaries`` (rule 21);
    the first group that must be worked alone (``lone``) is claimed alone; else the suspect
    groups, up to ``per_run`` of each run, are taken over together, by themselves (rule 20:
    if this claim dies too, each is next worked alone); else the first ``per_run`` groups of
    each run, leases first, then steps, then loose rows, each kind in ledger order (rules
    8, 13). Several groups are marked called together (``together``, rule 20).

    The runs' locks are held to the statement's end, as a transaction's were: the heads are
    read on the snapshot the statement began with, and the claim takes only rows still
    claimable when it writes them, so a row another sweeper claimed meanwhile is left out.

    No CTE is read again per row of the ledger, whatever the planner's statistics say:
    the runs locked are one array, read once (``run_id = ANY(ARRAY(SELECT id FROM taken))``,
    an index condition or a cheap filter), and the chosen groups are two sets the UPDATE
    looks each row up in (hashed subplans). A join to the CTEs (``run_id IN (SELECT ...)``)
    was planned, on a ledger whose statistics predate its unresolved rows, as a nested
    loop that read the CTE again for every unresolved row of the ledger, all the while
    holding the runs' locks, so that sweepers starting together found every run taken.
    """
    taking_sql, taking_params = _taking(run_ids, max_attempts, skip_locked, limit)
    resource, _, _ = names()
    # An InitPlan: computed once, before any row is read.
    locked = "ARRAY(SELECT id FROM taken)"
    heads_sql, heads_params = _heads(f"{resource}.run_id = ANY({locked})", [], max_attempts)
    down_sql, down_params = in_pairs(("h.module", "h.backend"), down, types=("varchar", "varchar"))
    canary_sql, canary_params = in_pairs(("h.module", "h.backend"), canaries, types=("varchar", "varchar"))
    # lease, step, loose row: the order of kinds within a run (the heads' columns 9 and 3)
    kind = "CASE WHEN c.lease = 1 THEN 0 WHEN c.alone <> 0 THEN 2 ELSE 1 END"
    head_names = ", ".join(HEAD_COLUMNS)
    choosing = f"""
        taken AS MATERIALIZED ({taking_sql}),
        heads({head_names}) AS MATERIALIZED ({heads_sql}),
        seen AS (
            SELECT h.*, ({down_sql}) AS down, ({canary_sql}) AS canary,
                   ROW_NUMBER() OVER (PARTITION BY h.module, h.backend ORDER BY h.run_id, h.first) AS nth_of_backend
            FROM heads h
        ),
        open AS (SELECT * FROM seen WHERE NOT down OR (canary AND nth_of_backend = 1)),
        lonely AS (SELECT *, 1 AS nth FROM open WHERE lone = 1 ORDER BY run_id, first LIMIT 1),
        suspects AS (
            SELECT * FROM lonely
            UNION ALL
            SELECT {", ".join(HEAD_COLUMNS)}, down, canary, nth_of_backend, nth FROM (
                SELECT o.*, ROW_NUMBER() OVER (PARTITION BY o.run_id ORDER BY o.first) AS nth
                FROM open o WHERE o.suspect = 1
            ) AS s WHERE s.nth <= %s AND NOT EXISTS (SELECT 1 FROM lonely)
        ),
        ranked AS (
            SELECT c.*, ROW_NUMBER() OVER (PARTITION BY c.run_id ORDER BY {kind}, c.first) AS nth
            FROM open c
        ),
        chosen AS MATERIALIZED (
            SELECT s.* FROM suspects s
            UNION ALL
            SELECT {", ".join(f"r.{c}" for c in HEAD_COLUMNS)}, r.down, r.canary, r.nth_of_backend, r.nth
            FROM ranked r WHERE r.nth <= %s AND NOT EXISTS (SELECT 1 FROM suspects)
        )"""
    lease = LEASE_KIND
    # Only rows of the runs locked (`rows.LOCK_ORDER`); of those, the chosen groups' rows,
    # looked up in two sets hashed once: subqueries under an OR are never made a join.
    where = (
        f"{resource}.run_id = ANY({locked}) AND ("
        f"{resource}.id IN (SELECT alone FROM chosen WHERE alone <> 0) OR ("
        f"({resource}.step_id, {resource}.backend) IN (SELECT step_id, backend FROM chosen WHERE alone = 0) "
        f"AND NOT ({resource}.kind = %s)))"
    )
    claimable_sql, claimable_params = claimable(connection.alias, max_attempts)
    claim_sql, claim_params = rows.claiming(
        f"{where} AND {claimable_sql}",
        [lease, *claimable_params],
        token,
        called_together="(SELECT COUNT(*) > 1 FROM chosen)",
        suspects="(EXISTS (SELECT 1 FROM suspects) AND NOT EXISTS (SELECT 1 FROM lonely))",
    )
    returned = ", ".join(f"c.{c}" for c in rows.CLAIMED_COLUMNS)
    own = ["NULL"] * len(rows.CLAIMED_COLUMNS)
    group = own[:1] + ["h.run_id", "h.step_id"] + own[3:-1] + ["h.backend"]
    # The rows taken, then the groups chosen, then the statement's own row: the rows are
    # given to their groups by the caller, as they are keyed (`claims.claim`).
    sql = f"""WITH {choosing},
        claimed AS ({claim_sql})
        SELECT {returned}, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::bigint,
               NULL::bigint[], NULL::boolean, NULL::boolean
        FROM claimed c
        UNION ALL
        SELECT {", ".join(group)}, CASE WHEN h.lease = 1 THEN 'lease' WHEN h.alone <> 0 THEN 'row' ELSE 'step' END,
               CASE WHEN h.alone <> 0 THEN h.alone ELSE h.step_id END,
               h.action_id, h.step_key, h.module, h.nth, NULL, NULL, NULL
        FROM chosen h
        UNION ALL
        SELECT {", ".join(own)}, NULL, NULL, NULL, NULL, NULL, NULL, (SELECT ARRAY_AGG(id) FROM taken),
               (SELECT COUNT(*) FROM open) > (SELECT COUNT(*) FROM chosen),
               (SELECT COUNT(*) > 1 FROM chosen)"""
    params = [
        *taking_params,
        *heads_params,
        *down_params,
        *canary_params,
        per_run,
        per_run,
        *claim_params,
    ]
    rows.taking(rows.RUNS)
    rows.taking(rows.LEDGER)
    return list(fetch_prepared(sql, params))


def in_pairs(
    columns: Sequence[str], pairs: Iterable[tuple[Any, Any]], types: tuple[str, str] = ("bigint", "varchar")
) -> tuple[str, list[Any]]:
    """``(a, b)`` is one of ``pairs``: SQL and params (two arrays of ``types``)."""
    pairs = list(pairs)
    firsts, seconds = [p[0] for p in pairs], [p[1] for p in pairs]
    return (
        f"({columns[0]}, {columns[1]}) IN (SELECT * FROM unnest(%s::{types[0]}[], %s::{types[1]}[]))",
        [firsts, seconds],
    )


def called_rows(token: uuid.UUID, steps: Sequence[tuple[int, str]], alone: Sequence[int]) -> tuple[str, list[Any]]:
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
def _status_counts(alias: str, max_attempts: int) -> tuple[str, tuple[Any, ...]]:
    unresolved_sql, unresolved_params = where(Resource.objects.filter(state__in=UNRESOLVED))
    retryable_sql, retryable_params = where(Resource.objects.filter(rows.keeps_run_pending(max_attempts)))
    resource, _, _ = names()
    sql = (
        f"SELECT {resource}.run_id, COUNT(*), SUM(CASE WHEN {unresolved_sql} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN {retryable_sql} THEN 1 ELSE 0 END) FROM {resource} WHERE {{runs}} GROUP BY {resource}.run_id"
    )
    return sql, (*unresolved_params, *retryable_params)


def status_counts(run_ids: Sequence[int], max_attempts: int) -> dict[int, dict[str, int]]:
    """Per run of ``run_ids``: its rows, its unresolved rows, and the rows the sweep will
    still try (`rows.keeps_run_pending`). Runs without rows are absent."""
    return {
        run_id: {"total": total, "unresolved": unresolved, "retryable": retryable}
        for run_id, total, unresolved, retryable in fetch_prepared(*counting(run_ids, max_attempts))
    }


def counting(run_ids: Sequence[int], max_attempts: int) -> tuple[str, list[Any]]:
    """`status_counts` as a query (SQL, params) of four columns: run id, rows, unresolved
    rows, rows the sweep will still try; for a statement that uses the counts at once."""
    sql, params = _status_counts(connection.alias, max_attempts)
    resource, _, _ = names()
    runs_sql, runs_params = in_list(f"{resource}.run_id", run_ids)
    return sql.replace("{runs}", runs_sql), [*params, *runs_params]
