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
from django.db.models import Field, ForeignKey, Model

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
    model: type[Model], names: Sequence[str], rows: Sequence[Sequence[Any]], fixed: Mapping[str, Any] | None = None
) -> Statement:
    """`inserting`, for rows of plain JSON values (numbers, strings, JSON fields' dicts): the
    rows travel as one JSON document, which the driver sends as it is, however many rows
    and whatever their text (an array of text needs each element quoted and escaped).
    ``fixed`` gives some fields one value for every row."""
    fixed = fixed or {}
    meta, quote = model._meta, connection.ops.quote_name
    fields = [field_of(model, name) for name in names]
    fixed_fields = [field_of(model, name) for name in fixed]
    record = ", ".join(f"{quote(column_of(f))} {f.db_type(connection)}" for f in fields)
    picked = [f"x.{quote(column_of(f))}" for f in fields] + [f"%s::{f.db_type(connection)}" for f in fixed_fields]
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(column_of(f)) for f in (*fields, *fixed_fields))}) "
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


def updating(
    model: type[Model],
    changes: Mapping[Any, Mapping[str, Any]],
    where: str,
    where_params: Sequence[Any],
    expressions: Mapping[str, str] | None = None,
    fixed: Mapping[str, Any] | None = None,
    key: str | None = None,
    returning: str = "",
) -> Statement:
    """The UPDATE that gives each row its own values, as one statement over arrays.

    ``changes`` maps a row's id to ``{field name: value}``; a row leaves the fields it does
    not name as they are. With ``key`` (a foreign key's name) it maps that key's value
    instead, and every row with that value takes the values. ``expressions`` maps a field
    name to SQL used instead of the value when a row names the field with the value
    ``SPECIAL`` (with ``r`` the row as it was, ``v`` its new values). ``fixed`` sets fields
    to one value on every matched row. ``where`` (SQL on ``r``) fences the write, e.g. to
    the rows a claim still holds. ``returning`` (SQL on ``r``) is what the statement answers
    of each row it changed.
    """
    expressions = expressions or {}
    fixed = fixed or {}
    names = sorted({name for values in changes.values() for name in values})
    ids = sorted(changes)
    rows = []
    for pk in ids:
        values = changes[pk]
        row = [pk]
        for name in names:
            value = values.get(name, _KEEP)
            special = value is SPECIAL
            row += [None if value is _KEEP or special else value, value is not _KEEP and not special, special]
        rows.append(row)
    meta, quote = model._meta, connection.ops.quote_name
    key_field = field_of(model, key) if key else meta.pk
    assert key_field is not None
    key_type = (
        key_field.target_field.db_type(connection)
        if isinstance(key_field, ForeignKey)
        else key_field.db_type(connection)
    )
    array_names, array_types = ["id"], [f"{key_type}[]"]
    columns = [[row[0] for row in rows]]
    sets = []
    for i, name in enumerate(names):
        field = field_of(model, name)
        column = quote(column_of(field))
        columns += [
            [_plain(field.get_db_prep_save(row[1 + 3 * i], connection)) for row in rows],
            [row[2 + 3 * i] for row in rows],
            [row[3 + 3 * i] for row in rows],
        ]
        array_names += [f"v{i}", f"set{i}", f"special{i}"]
        array_types += [f"{field.db_type(connection)}[]", "boolean[]", "boolean[]"]
        derived = f"WHEN v.special{i} THEN {expressions[name].format(v=f'v.v{i}')} " if name in expressions else ""
        sets.append(f"{column} = CASE {derived}WHEN v.set{i} THEN v.v{i} ELSE r.{column} END")
    fixed_params = []
    for name, value in fixed.items():
        field = field_of(model, name)
        sets.append(f"{quote(column_of(field))} = %s")
        fixed_params.append(field.get_db_prep_save(value, connection))
    sql = (
        f"UPDATE {quote(meta.db_table)} AS r SET {', '.join(sets)} "
        f"FROM unnest({', '.join(f'%s::{t}' for t in array_types)}) AS v({', '.join(array_names)}) "
        f"WHERE r.{quote(column_of(key_field))} = v.id AND {where}"
    )
    if returning:
        sql += f" RETURNING {returning}"
    return sql, [*fixed_params, *columns, *where_params]


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
