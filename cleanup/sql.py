"""Statements sent as server-side prepared statements, and set-based writes through arrays.

The pass and the ledger row's owner (`cleanup.rows`) send the same few statements on every
pass: prepared once per connection, they are only executed after that. Many rows are
written in one statement: the values travel as one array per column (``unnest``), or as
one JSON document (``jsonb_to_recordset``), so a batch of a thousand rows costs one
statement and no per-row SQL; and several writes can go out as one statement
(`together`). The app runs on PostgreSQL alone. A forked process starts with connections of
its own (`forget_inherited_connections`).
May import: Django only (the engine's data layer, beside the models).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model

# What a forked process inherited and must never use nor close (see below); kept referenced,
# so that no finalizer closes it either.
_inherited: list[Any] = []


def forget_inherited_connections() -> None:
    """In a forked process (django-q2's workers, pusher and monitor; a preloading server's
    workers): drop the connections and the connection pool inherited from the parent.

    Their sockets are the parent's too: a query from the child would interleave with the
    parent's and its siblings' on one session (psycopg then reads another process's answer:
    "the last operation didn't produce records"), and the inherited pool has none of its
    threads. Closing them would end the parent's sessions, so they are put aside unclosed,
    and the child opens its own at its first query.
    """
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper

    _inherited.append(DatabaseWrapper._connection_pools)  # type: ignore[attr-defined]  # Django 5.1+, not in the stubs
    DatabaseWrapper._connection_pools = {}  # type: ignore[attr-defined]  # a new dict; the parent's, unused, stays
    for wrapper in connections.all(initialized_only=True):
        if wrapper.connection is not None:
            _inherited.append(wrapper.connection)
            wrapper.connection = None
            wrapper.in_atomic_block = False
            wrapper.savepoint_ids = []
            wrapper.needs_rollback = False


def execute_prepared(sql: str, params: Sequence[Any]) -> int:
    """`fetch_prepared` for a statement that returns no rows; answers its row count."""
    count: int = fetch_prepared(sql, params, rows=False)
    return count


def fetch_prepared(sql: str, params: Sequence[Any], rows: bool = True) -> Any:
    """Rows of a statement sent as a server-side prepared statement on PostgreSQL.

    Django binds parameters on the client, so PostgreSQL parses and plans each statement
    anew; for the finder, which every pass sends, planning costs more than running it.
    Prepared once per connection (with one generic plan: its shape does not depend on
    the values), it is only executed after that. The cursor goes through Django's wrappers
    like any other (query logging, execute wrappers, error translation). A site behind a
    transaction-pooling PgBouncer sets ``DISABLE_SERVER_SIDE_CURSORS`` (the site's
    ``DATABASE_TRANSACTION_POOLER``) and gets the plain way.
    """
    raw = _preparing_connection()
    if raw is None:
        cursor = connection.cursor()
    elif connection.queries_logged:
        cursor = connection.make_debug_cursor(_prepared_cursor_class()(raw))
    else:
        cursor = connection.make_cursor(_prepared_cursor_class()(raw))
    with cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if rows else cursor.rowcount


def _preparing_connection() -> Any:
    """The psycopg connection to prepare statements on, or None where that is not done."""
    if not _prepares(connection):
        return None
    connection.ensure_connection()
    raw = connection.connection
    if not getattr(raw, "_cleanup_prepares", False):
        _ready(connection)
    return raw


def _prepares(wrapper: Any) -> bool:
    """Prepare on this connection? Not behind a transaction pooler, and not where Django's
    own cursors bind on the server (``server_side_binding``): there the session setting
    below would give every ORM query a generic plan too."""
    settings_dict = wrapper.settings_dict
    return not settings_dict.get("DISABLE_SERVER_SIDE_CURSORS") and not (settings_dict.get("OPTIONS") or {}).get(
        "server_side_binding"
    )


def ready_new_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: ready a PostgreSQL connection for the prepared statements
    while it is still in autocommit, so that no rollback undoes the setting."""
    if _prepares(connection):
        _ready(connection)


def _ready(wrapper: Any) -> None:
    raw = wrapper.connection
    with wrapper.wrap_database_errors:
        # Django's own cursors bind on the client and never prepare, whatever this says;
        # psycopg prepares nothing at all while it is None (Django's default).
        if raw.prepare_threshold is None:
            raw.prepare_threshold = PREPARE_THRESHOLD
        with raw.cursor() as cursor:
            cursor.execute("SET plan_cache_mode = force_generic_plan")
    # A SET in a transaction that rolls back is undone: it is sent again next time then.
    raw._cleanup_prepares = not wrapper.in_atomic_block


# psycopg's own default: a statement run this often is prepared (ours say so at once).
PREPARE_THRESHOLD = 5


@functools.cache
def _prepared_cursor_class() -> type:
    import psycopg

    class Prepared(psycopg.Cursor):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            return super().execute(query, params, prepare=True, **kwargs)

    return Prepared


def field_of(model: type[Model], name: str) -> Field[Any, Any]:
    """The concrete field ``name`` of ``model`` (a column of its table)."""
    field = model._meta.get_field(name)
    if not isinstance(field, Field):
        raise TypeError(f"{model.__name__}.{name} is not a column of its table")
    return field


def column_of(field: Field[Any, Any]) -> str:
    """The column a concrete field is stored in."""
    if field.column is None:
        raise TypeError(f"{field.name} has no column of its own")
    return field.column


Statement = tuple[str, list[Any]]  # SQL and its params


def inserting_json(
    model: type[Model],
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fixed: Mapping[str, Any] | None = None,
    fixed_sql: Mapping[str, str] | None = None,
) -> Statement:
    """`inserting`, for rows of plain JSON values (numbers, strings, JSON fields' dicts): the
    rows travel as one JSON document, which the driver sends as it is, however many rows
    and whatever their text (an array of text needs each element quoted and escaped).
    ``fixed`` gives some fields one value for every row; ``fixed_sql`` one SQL expression
    (the database's clock, say)."""
    fixed = fixed or {}
    fixed_sql = fixed_sql or {}
    meta, quote = model._meta, connection.ops.quote_name
    fields = [field_of(model, name) for name in names]
    fixed_fields = [field_of(model, name) for name in fixed]
    sql_fields = [field_of(model, name) for name in fixed_sql]
    record = ", ".join(f"{quote(column_of(f))} {f.db_type(connection)}" for f in fields)
    picked = [f"x.{quote(column_of(f))}" for f in fields] + [f"%s::{f.db_type(connection)}" for f in fixed_fields]
    picked += list(fixed_sql.values())
    written = (*fields, *fixed_fields, *sql_fields)
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(column_of(f)) for f in written)}) "
        f"SELECT {', '.join(picked)} FROM jsonb_to_recordset(%s::jsonb) AS x({record})"
    )
    columns = [column_of(f) for f in fields]
    document = json.dumps([dict(zip(columns, row, strict=True)) for row in rows])
    params = [f.get_db_prep_save(value, connection) for f, value in zip(fixed_fields, fixed.values(), strict=True)]
    return sql, [*params, document]


def together(statements: Sequence[Statement], last: Statement | None = None) -> Statement:
    """Several data-modifying statements sent as one (each a ``WITH`` part of the last), so
    that they cost one round trip and are atomic without a transaction of their own.

    PostgreSQL runs every part to completion on one snapshot: no part sees what another
    wrote, so the parts must write different rows. ``last`` (by default the last of
    ``statements``) is the one whose rows or row count the statement answers.
    """
    parts = list(statements)
    if last is None:
        last = parts.pop()
    if not parts:
        return last
    sql = "WITH " + ", ".join(f"w{i} AS ({part})" for i, (part, _) in enumerate(parts)) + " " + last[0]
    return sql, [p for _, params in parts for p in params] + list(last[1])


def shared_values(
    model: type[Model],
    values: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    expressions: Mapping[str, str] | None = None,
    offsets: Mapping[str, str] | None = None,
) -> tuple[str, list[Any], list[str]]:
    """Sets of new values written once each and shared by every row that takes one: a row
    names its set by its number (from 1, in ``values``), so a thousand rows given back
    alike cost one set of values, not a thousand.

    Answers a SELECT of one row whose columns are arrays, one element per set (for each
    field of ``names``: its value, whether the set names the field, and with
    ``expressions``, whether it names it with ``SPECIAL``); its params; and for an UPDATE
    ``FROM`` that row as ``d`` and the rows' numbers as ``k.n``, the SET clause of each
    field of ``names``, which leaves a field the set does not name as it was (with ``r`` the
    row as it was; an expression's ``{v}`` is the value's place). ``names`` is fixed by the
    caller, so that the statement is the same whichever sets a write holds.

    ``offsets`` names the fields whose values are intervals (timedeltas, or None) after a
    time the statement reads itself: each maps to that time's SQL (the database's clock),
    and the field is set to it plus the interval (None stays NULL).
    """
    expressions = expressions or {}
    offsets = offsets or {}
    quote = connection.ops.quote_name
    columns, params, sets = [], [], []
    for i, name in enumerate(names):
        field = field_of(model, name)
        column = quote(column_of(field))
        given = [value.get(name, _KEEP) for value in values]
        if name in offsets:
            prepared = [None if v is _KEEP or v is SPECIAL else v for v in given]
            kind = "interval"
        else:
            prepared = [
                None if v is _KEEP or v is SPECIAL else _plain(field.get_db_prep_save(v, connection)) for v in given
            ]
            kind = str(field.db_type(connection))
        params += [prepared, [v is not _KEEP and v is not SPECIAL for v in given]]
        columns += [f"%s::{kind}[] AS v{i}", f"%s::boolean[] AS set{i}"]
        derived = ""
        if name in expressions:
            params.append([v is SPECIAL for v in given])
            columns.append(f"%s::boolean[] AS special{i}")
            derived = f"WHEN d.special{i}[k.n] THEN {expressions[name].format(v=f'd.v{i}[k.n]')} "
        value = f"({offsets[name]} + d.v{i}[k.n])" if name in offsets else f"d.v{i}[k.n]"
        sets.append(f"{column} = CASE {derived}WHEN d.set{i}[k.n] THEN {value} ELSE r.{column} END")
    return f"SELECT {', '.join(columns)}", params, sets


def _plain(value: Any) -> Any:
    """A choices member (a ``str`` subclass) as the plain string the driver adapts."""
    return str(value) if isinstance(value, str) and type(value) is not str else value


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


class _Special:
    def __repr__(self) -> str:
        return "SPECIAL"


_KEEP = _Keep()
SPECIAL = _Special()
