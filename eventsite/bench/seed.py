"""Seeding the scratch database with set-based SQL: one statement per shape of rows.

A work set is ``runs`` ended runs x ``steps`` steps x ``per_step`` live rows, all made by
the bench's action; history is resolved rows of long-finished runs (20 per run), which
every way must step over. Columns the bench does not name get the model's default, so a
column added to a model later does not break the seed.
"""

from django.apps import apps
from django.utils import timezone
from psycopg import sql
from psycopg.types.json import Jsonb

from cleanup.models import Attempt, Counter, ModuleEvent, ModuleHealth, Resource, Run, RunLog, Step

from .module import ACTION_ID, MODULE

HISTORY_ROWS_PER_RUN = 20
UNRESOLVED = ("live", "reverting", "failed", "drifted")
TABLES = [m._meta.db_table for m in (Attempt, RunLog, Resource, Step, Run)]
# The log a run given back leaves, one entry of each kind.
TRACE_LOG = ("run.started", "step.performed", "run.completed", "cleanup.swept")


def run_tables():
    """Every table of the app whose rows belong to a run, the runs last."""
    owned = [
        m._meta.db_table
        for m in apps.get_app_config("cleanup").get_models()
        if any(f.column == "run_id" for f in m._meta.concrete_fields)
    ]
    return [*owned, Run._meta.db_table]


def _other_columns(model, named):
    """The model's NOT NULL columns the bench does not name, with the model's defaults."""
    columns, values = [], []
    for field in model._meta.concrete_fields:
        if field.primary_key or field.column in named or field.null:
            continue
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            value = timezone.now()
        elif field.has_default():
            value = field.get_default()
        else:
            continue
        columns.append(field.column)
        values.append(Jsonb(value) if isinstance(value, dict | list) else value)
    return columns, values


def _insert(model, exprs, source, returning):
    columns, values = _other_columns(model, exprs)
    return sql.SQL("INSERT INTO {table} ({columns}) SELECT {values} FROM {source} RETURNING {returning}").format(
        table=sql.Identifier(model._meta.db_table),
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in [*exprs, *columns]),
        values=sql.SQL(", ").join([*(sql.SQL(e) for e in exprs.values()), *(sql.Literal(v) for v in values)]),
        source=sql.SQL(source),
        returning=sql.SQL(returning),
    )


def _seed(conn, runs, steps, per_step, resolved, ended_days_ago=0, traces=False):
    """Insert runs, their steps and their rows in one statement; answers the rows made.

    ``ended_days_ago``: when the runs ended (and their rows were given back, for resolved
    ones), so that history can be old enough for retention to prune. ``traces``: resolved
    rows also get the attempt that gave them back, and their runs a log.
    """
    if runs <= 0 or steps <= 0 or per_step <= 0:
        return 0
    ended = f"now() - interval '{int(ended_days_ago)} days'"
    run = _insert(
        Run,
        {
            "name": "'bench ' || g",
            "status": "'completed'",
            "cleanup_status": "'complete'" if resolved else "'pending'",
            "auto_cleanup": "true",
            "created_at": "now()",
            "updated_at": "now()",
            "ended_at": ended,
        },
        f"generate_series(1, {int(runs)}) AS g",
        "id",
    )
    step = _insert(
        Step,
        {
            "run_id": "runs.id",
            "position": "p",
            "action_id": f"'{ACTION_ID}'",
            "params": "'{}'::jsonb",
            "idempotency_key": "'bench-' || runs.id || '-' || p",
            "status": "'done'",
            "attempts": "1",
            "last_error": "''",
            "started_at": "now()",
            "finished_at": "now()",
        },
        f"runs CROSS JOIN generate_series(0, {int(steps) - 1}) AS p",
        "id, run_id",
    )
    rows = {
        "run_id": "steps.run_id",
        "step_id": "steps.id",
        "module": f"'{MODULE}'",
        "kind": "'creature'",
        "ref": "'c-' || steps.id || '-' || k",
        "member_key": "''",
        "payload": "'{}'::jsonb",
        "state": "'reverted'" if resolved else "'live'",
        "revert_attempts": "1" if resolved else "0",
        "retryable": "true",
        "last_error": "''",
        "created_at": "now()",
        "updated_at": "now()",
        "resolved_at": f"{ended} - interval '1 day'" if resolved else "NULL",
    }
    if any(f.column == "action" for f in Resource._meta.concrete_fields):
        rows["action"] = f"'{ACTION_ID}'"  # the ledger keeps the action on the row too
    resource = _insert(Resource, rows, f"steps CROSS JOIN generate_series(0, {int(per_step) - 1}) AS k", "id, run_id")
    parts = {"run": run, "step": step, "resource": resource}
    traced = sql.SQL("")
    if resolved and traces:
        # What a run given back leaves behind: an attempt per row, and its log.
        parts["attempt"] = _insert(
            Attempt,
            {
                "resource_id": "made.id",
                "run_id": "made.run_id",
                "number": "1",
                "at": f"{ended} - interval '1 day'",
                "outcome": "'done'",
                "error": "''",
                "by": "'bench'",
            },
            "made",
            "1",
        )
        parts["log"] = _insert(
            RunLog,
            {
                "run_id": "runs.id",
                "kind": "kinds.kind",
                "detail": "'{}'::jsonb",
                "at": ended,
                # A place in the change feed after every place given, as the feed's stamper gives.
                "seq": f"(SELECT coalesce(max(seq), 0) FROM {RunLog._meta.db_table}) + row_number() OVER ()",
            },
            f"runs CROSS JOIN unnest(ARRAY[{', '.join(repr(k) for k in TRACE_LOG)}]) AS kinds(kind)",
            "1",
        )
        traced = sql.SQL(", attempts AS ({attempt}), logged AS ({log})")
    statement = sql.SQL(
        "WITH runs AS ({run}), steps AS ({step}), made AS ({resource}){traced} SELECT count(*) FROM made"
    ).format(traced=traced.format(**parts), **parts)
    return conn.execute(statement).fetchone()[0]


def wipe(conn, modules=False):
    """Empty the ledger; ``modules``: the modules' health and log and the metrics' counters too."""
    tables = [*TABLES, *(m._meta.db_table for m in (ModuleHealth, ModuleEvent, Counter) if modules)]
    conn.execute(
        sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(sql.SQL(", ").join(sql.Identifier(t) for t in tables))
    )


# Built once after a big seed rather than maintained and checked row by row, which is
# several times faster: the indexes that back no constraint, and the foreign keys.
PLAIN_INDEXES = """
SELECT pg_get_indexdef(i.indexrelid), format('DROP INDEX %%s', i.indexrelid::regclass) FROM pg_index i
WHERE i.indrelid = ANY(%s::regclass[]) AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
"""
FOREIGN_KEYS = """
SELECT format('ALTER TABLE %%s ADD CONSTRAINT %%I %%s', conrelid::regclass, conname, pg_get_constraintdef(oid)),
       format('ALTER TABLE %%s DROP CONSTRAINT %%I', conrelid::regclass, conname)
FROM pg_constraint WHERE contype = 'f' AND conrelid = ANY(%s::regclass[])
"""


def seed_history(conn, rows, ended_days_ago=0, traces=False):
    """Resolved rows of finished runs; answers the last history run's id (0 for none).

    In one transaction, so an interrupted seed leaves the schema as it was.
    ``ended_days_ago``: how long ago those runs ended (past the retention window, retention
    may prune them); ``traces``: with their attempts and log, as the engine leaves them.
    """
    full, rest = divmod(rows, HISTORY_ROWS_PER_RUN)
    with conn.transaction():
        conn.execute("SET LOCAL maintenance_work_mem = '256MB'")
        rebuild = []
        for query in (FOREIGN_KEYS, PLAIN_INDEXES):
            rebuild += conn.execute(query, [TABLES]).fetchall()
        for _, drop in rebuild:
            conn.execute(drop)
        _seed(conn, full, 1, HISTORY_ROWS_PER_RUN, resolved=True, ended_days_ago=ended_days_ago, traces=traces)
        _seed(conn, 1 if rest else 0, 1, rest, resolved=True, ended_days_ago=ended_days_ago, traces=traces)
        for create, _ in reversed(rebuild):
            conn.execute(create)
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(Resource._meta.db_table)))
    return last_run_id(conn)


def last_run_id(conn):
    return conn.execute(
        sql.SQL("SELECT coalesce(max(id), 0) FROM {}").format(sql.Identifier(Run._meta.db_table))
    ).fetchone()[0]


def reseed_work(conn, after, runs, steps, per_step, analyze=True):
    """Drop every run after ``after`` (the history), then seed a fresh work set.

    ``analyze``: refresh the planner's statistics, which the work set changes entirely
    without history and by a few percent beside a big one.
    """
    with conn.transaction():  # the foreign keys are checked at commit, whatever the order
        for table in run_tables():
            column = "id" if table == Run._meta.db_table else "run_id"
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE {} > %s").format(sql.Identifier(table), sql.Identifier(column)), [after]
            )
    made = seed_work(conn, runs, steps, per_step)
    for table in TABLES if analyze else ():
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    return made


def seed_work(conn, runs, steps, per_step):
    """A work set of ended runs whose rows are all live, beside whatever is there."""
    return _seed(conn, runs, steps, per_step, resolved=False)


def vacuum_analyze(conn):
    """What autovacuum would have done by now: statistics and the visibility map."""
    for table in run_tables():
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))


def count_rows(conn, after, states):
    return conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE run_id > %s AND state = ANY(%s)").format(
            sql.Identifier(Resource._meta.db_table)
        ),
        [after, list(states)],
    ).fetchone()[0]
