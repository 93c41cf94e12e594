"""The owner of a run's ``cleanup_status``: made from its rows (rule 5), under a lock on the run.

Nothing else writes it. The verdicts of a batch and its runs' statuses are written in one
transaction (`cleanup.sweep.verdicts`); a status left behind anyway is repaired by a later
pass (rule 24). A person's retry (`reset_for_person`, rule 6) and a resurrection
(`reopen`, rule 14) put a run back to ``pending``.
May import: the models, conf, `clock`, `cleanup.rows`, `statements`. Imported by the pass, the
runner, `manual` and `reconcile`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .. import clock, rows
from ..conf import max_revert_attempts
from ..models import TERMINAL, AlertedStatus, CleanupStatus, LogKind, Resource, Run, RunLog
from ..sql import column_of, fetch_prepared, field_of
from . import statements

# A log entry written with the statuses: its run's id, its kind and its detail.
LogRow = tuple[int, str, dict[str, Any]]
# What `write_statuses` answers: ``{run id: (status, unresolved rows)}``.
Statuses = dict[int, tuple[str, int]]
LOG_FIELDS = ("run", "kind", "detail")
# A ``cleanup.completed`` entry's place among those written with the statuses: after them.
COMPLETED_AFTER = 2**40


def lock_runs(run_ids: Iterable[int]) -> dict[int, tuple[bool, str]]:
    """Lock runs for a status write, in id order; answers ``{id: (auto_cleanup, status)}``.

    One prepared statement however many runs (`_locking`): every batch sends it."""
    rows.taking(rows.RUNS)
    return {pk: (auto, status) for pk, auto, status in fetch_prepared(_locking(), [sorted(set(run_ids))])}


@functools.cache
def _locking() -> str:
    """The statement of `lock_runs`: the runs of an array of ids, locked in id order."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column_of(field_of(Run, name))) for name in ("id", "auto_cleanup", "cleanup_status"))
    pk = quote(column_of(field_of(Run, "id")))
    return f"SELECT {columns} FROM {quote(Run._meta.db_table)} WHERE {pk} = ANY(%s::bigint[]) ORDER BY {pk} FOR UPDATE"


def write_statuses(
    runs: Mapping[int, tuple[bool, str]],
    now: dt.datetime | None,
    entries: Sequence[LogRow] = (),
    summaries: Sequence[LogRow] = (),
) -> Statuses:
    """Set each locked run's cleanup status from its rows; answers ``{id: (status, unresolved)}``.

    One statement counts the rows, makes each status (rule 5), writes those that changed,
    and writes the log ``entries`` and the ``summaries``: entries whose detail the statement
    completes with their run's unresolved rows, as ``remaining``. A run whose status turns
    ``complete`` here logs one ``cleanup.completed`` after them: the runs are locked, so of
    two writers only the first sees the change. ``now`` stamps the runs and the log; None
    is the database's clock when the statement runs.
    """
    ids = list(runs)
    counts_sql, counts_params = statements.counting(ids, max_revert_attempts())
    quote = connection.ops.quote_name
    run_table, log_table = quote(Run._meta.db_table), quote(RunLog._meta.db_table)
    log_columns = ", ".join(quote(column_of(field_of(RunLog, name))) for name in (*LOG_FIELDS, "at"))
    status = CleanupStatus
    # Rule 5: complete when nothing is unresolved, pending while anything is retryable. A
    # run a person left out of the automatic sweep (rule 7) is ``left`` while it holds
    # anything: its cleanup did not give up, it was never asked to start.
    made = f"""CASE
        WHEN COALESCE(c.unresolved, 0) = 0 THEN
            CASE WHEN COALESCE(c.total, 0) > 0 THEN '{status.COMPLETE.value}' ELSE '{status.NOT_REQUIRED.value}' END
        WHEN NOT v.auto THEN '{status.LEFT.value}'
        WHEN COALESCE(c.retryable, 0) > 0 THEN '{status.PENDING.value}'
        ELSE '{status.INCOMPLETE.value}' END"""
    sql = f"""WITH counted(run_id, total, unresolved, retryable) AS ({counts_sql}),
        made AS (
            SELECT v.id, v.current, COALESCE(c.total, 0) AS total, COALESCE(c.unresolved, 0) AS unresolved,
                   {made} AS status
            FROM unnest(%s::bigint[], %s::boolean[], %s::varchar[]) AS v(id, auto, current)
            LEFT JOIN counted c ON c.run_id = v.id
        ),
        changed AS (
            UPDATE {run_table} AS r SET cleanup_status = m.status, updated_at = COALESCE(%s::timestamptz, {clock.SQL})
            FROM made m WHERE r.id = m.id AND m.status <> m.current
        ),
        logged AS (
            INSERT INTO {log_table} ({log_columns})
            SELECT e.run_id, e.kind, e.detail, COALESCE(%s::timestamptz, {clock.SQL}) FROM (
                SELECT x.place, x.run_id, x.kind,
                       CASE WHEN x.counted THEN x.detail || jsonb_build_object('remaining', m.unresolved)
                            ELSE x.detail END AS detail
                FROM jsonb_to_recordset(%s::jsonb)
                     AS x(place bigint, run_id bigint, kind varchar, detail jsonb, counted boolean)
                LEFT JOIN made m ON m.id = x.run_id
                UNION ALL
                SELECT {COMPLETED_AFTER} + m.id, m.id, '{LogKind.CLEANUP_COMPLETED.value}',
                       jsonb_build_object('resources', m.total)
                FROM made m WHERE m.status = '{status.COMPLETE.value}' AND m.current <> '{status.COMPLETE.value}'
            ) AS e ORDER BY e.place
        )
        SELECT m.id, m.status, m.unresolved FROM made m"""
    log = [
        {"run_id": run_id, "kind": str(kind), "detail": detail, "counted": counted}
        for counted, rows_ in ((False, entries), (True, summaries))
        for run_id, kind, detail in rows_
    ]
    for place, entry in enumerate(log):
        entry["place"] = place
    params = [
        *counts_params,
        ids,
        [runs[pk][0] for pk in ids],
        [runs[pk][1] for pk in ids],
        now,
        now,
        json.dumps(log),
    ]
    return {run_id: (status_, unresolved) for run_id, status_, unresolved in fetch_prepared(sql, params)}


def refresh_statuses(run_ids: Iterable[int]) -> Statuses:
    """Make the cleanup status of ``run_ids`` say what their rows say, under their locks."""
    with transaction.atomic():
        return write_statuses(lock_runs(run_ids), None)


def repair_statuses(limit: int) -> int:
    """Terminal runs left ``pending`` with nothing the sweep will still try get their true status.

    A verdict and its run's status are written together, but a status can still be left
    behind (by an older version, or a write that died between them); the next pass
    repairs it here. Answers how many runs were looked at.
    """
    retryable = Resource.objects.filter(rows.keeps_run_pending(max_revert_attempts()), run=OuterRef("pk"))
    stale = list(
        Run.objects.filter(status__in=TERMINAL, cleanup_status=CleanupStatus.PENDING)
        .exclude(Exists(retryable))
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    if stale:
        refresh_statuses(stale)
    return len(stale)


def refresh_cleanup_status(run: Run) -> int:
    """Set a run's cleanup status from its rows; answers how many are unresolved.

    Under a lock on the run row, so that of two writers finishing together the one that
    writes last has also counted last.
    """
    status, unresolved = refresh_statuses([run.pk]).get(run.pk, (run.cleanup_status, 0))
    run.cleanup_status = status
    return unresolved


def reopen(run_ids: Iterable[int], now: dt.datetime) -> int:
    """Runs that have rows to give back again (rule 14's resurrections) are ``pending``."""
    return Run.objects.filter(pk__in=list(run_ids)).update(cleanup_status=CleanupStatus.PENDING, updated_at=now)


def reset_for_person(run: Run, actor: str | None) -> int:
    """Rule 6: a person's cleanup puts the run's unresolved rows back in the sweep
    (`rows.reset_for_person`); the run turns ``pending`` and back into the automatic sweep,
    and the retry is logged with the person. Answers how many rows were reset. Only a
    person's request calls this (`cleanup.manual`, ``cleanup_run --reset``).
    """
    now = timezone.now()
    with transaction.atomic():
        lock_runs([run.pk])
        cleared = rows.reset_for_person(run.pk, now)
        Run.objects.filter(pk=run.pk).update(cleanup_status=CleanupStatus.PENDING, auto_cleanup=True, updated_at=now)
        # Staff were told it gave up; if it gives up again after this retry, that is news.
        Run.objects.filter(pk=run.pk, alerted_status=AlertedStatus.GAVE_UP).update(alerted_status=AlertedStatus.RETRIED)
        RunLog.write(run.pk, LogKind.CLEANUP_RETRY, resources=cleared, by=actor)
    return cleared
