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

from cleanup.models import Resource, Run, RunLog, Step

from .module import ACTION_ID, MODULE

HISTORY_ROWS_PER_RUN = 20
UNRESOLVED = ("live", "reverting", "failed", "drifted")
TABLES = [m._meta.db_table for m in (RunLog, Resource, Step, Run)]


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


def _seed(conn, runs, steps, per_step, resolved):
    """Insert runs, their steps and their rows in one statement; answers the rows made."""
    if runs <= 0 or steps <= 0 or per_step <= 0:
        return 0
    run = _insert(
        Run,
        {
            "name": "'bench ' || g",
            "status": "'completed'",
            "cleanup_status": "'complete'" if resolved else "'pending'",
            "auto_cleanup": "true",
            "created_at": "now()",
            "updated_at": "now()",
            "ended_at": "now()",
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
        "resolved_at": "now() - interval '1 day'" if resolved else "NULL",
    }
    if any(f.column == "action" for f in Resource._meta.concrete_fields):
        rows["action"] = f"'{ACTION_ID}'"  # the ledger keeps the action on the row too
    resource = _insert(Resource, rows, f"steps CROSS JOIN generate_series(0, {int(per_step) - 1}) AS k", "1")
    statement = sql.SQL("WITH runs AS ({run}), steps AS ({step}), made AS ({resource}) SELECT count(*) FROM made")
    return conn.execute(statement.format(run=run, step=step, resource=resource)).fetchone()[0]


def wipe(conn):
    conn.execute(
        sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(sql.SQL(", ").join(sql.Identifier(t) for t in TABLES))
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


def seed_history(conn, rows):
    """Resolved rows of finished runs; answers the last history run's id (0 for none).

    In one transaction, so an interrupted seed leaves the schema as it was.
    """
    full, rest = divmod(rows, HISTORY_ROWS_PER_RUN)
    with conn.transaction():
        conn.execute("SET LOCAL maintenance_work_mem = '256MB'")
        rebuild = []
        for query in (FOREIGN_KEYS, PLAIN_INDEXES):
            rebuild += conn.execute(query, [TABLES]).fetchall()
        for _, drop in rebuild:
            conn.execute(drop)
        _seed(conn, full, 1, HISTORY_ROWS_PER_RUN, resolved=True)
        _seed(conn, 1 if rest else 0, 1, rest, resolved=True)
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
    made = _seed(conn, runs, steps, per_step, resolved=False)
    for table in TABLES if analyze else ():
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    return made


def count_rows(conn, after, states):
    return conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE run_id > %s AND state = ANY(%s)").format(
            sql.Identifier(Resource._meta.db_table)
        ),
        [after, list(states)],
    ).fetchone()[0]
