"""Statements sent as server-side prepared statements, and set-based writes through arrays.

The pass and the ledger row's owner (`cleanup.rows`) send the same few statements on every
pass: prepared once per connection, they are only executed after that. Many rows are
written in one statement: the values travel as one array per column and ``unnest`` turns
them back into rows, so a batch of a thousand rows costs one statement and no per-row SQL.
The app runs on PostgreSQL alone.
May import: Django only (the engine's data layer, beside the models).
"""

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import connection
from django.db.models import Model


def execute_prepared(sql: str, params: Sequence[Any]) -> int:
    """`fetch_prepared` for a statement that returns no rows; answers its row count."""
    return fetch_prepared(sql, params, rows=False)


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
    # The app runs on PostgreSQL; a connection of another database (a command run before
    # the site's database is configured) is left as it is.
    return (
        wrapper.vendor == "postgresql"
        and not settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
        and not (settings_dict.get("OPTIONS") or {}).get("server_side_binding")
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


def _arrays(
    model: type[Model], names: Sequence[str], rows: Sequence[Sequence[Any]]
) -> tuple[list[Any], list[list[Any]], list[str]]:
    """One list per field of ``names``, each value prepared as the field saves it."""
    fields = [model._meta.get_field(name) for name in names]
    columns = [[_plain(field.get_db_prep_save(row[i], connection)) for row in rows] for i, field in enumerate(fields)]
    types = [f"{field.db_type(connection)}[]" for field in fields]
    return fields, columns, types


def insert(objects: Iterable[Model], names: Sequence[str]) -> None:
    """Insert model instances (of one model, no primary key set) with the fields ``names``.

    What ``bulk_create`` does, without its per-object work: the batch's log entries and
    attempts are written by every pass.
    """
    objects = list(objects)
    if not objects:
        return
    model = type(objects[0])
    rows = [[getattr(obj, model._meta.get_field(name).attname) for name in names] for obj in objects]
    fields, columns, types = _arrays(model, names, rows)
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"SELECT * FROM unnest({', '.join(f'%s::{t}' for t in types)})"
    )
    execute_prepared(sql, columns)


def update_by_id(
    model: type[Model],
    changes: Mapping[Any, Mapping[str, Any]],
    where: str,
    where_params: Sequence[Any],
    expressions: Mapping[str, str] | None = None,
    fixed: Mapping[str, Any] | None = None,
    key: str | None = None,
) -> int:
    """Give each row its own values in one UPDATE; answers the number of rows changed.

    ``changes`` maps a row's id to ``{field name: value}``; a row leaves the fields it does
    not name as they are. With ``key`` (a foreign key's name) it maps that key's value
    instead, and every row with that value takes the values. ``expressions`` maps a field
    name to SQL used instead of the value when a row names the field with the value
    ``SPECIAL`` (with ``r`` the row as it was, ``v`` its new values). ``fixed`` sets fields
    to one value on every matched row. ``where`` (SQL on ``r``) fences the write, e.g. to
    the rows a claim still holds.
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
    key_field = meta.get_field(key) if key else meta.pk
    key_type = key_field.target_field.db_type(connection) if key else key_field.db_type(connection)
    array_names, array_types = ["id"], [f"{key_type}[]"]
    columns = [[row[0] for row in rows]]
    sets = []
    for i, name in enumerate(names):
        field = meta.get_field(name)
        column = quote(field.column)
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
        field = meta.get_field(name)
        sets.append(f"{quote(field.column)} = %s")
        fixed_params.append(field.get_db_prep_save(value, connection))
    sql = (
        f"UPDATE {quote(meta.db_table)} AS r SET {', '.join(sets)} "
        f"FROM unnest({', '.join(f'%s::{t}' for t in array_types)}) AS v({', '.join(array_names)}) "
        f"WHERE r.{quote(key_field.column)} = v.id AND {where}"
    )
    return execute_prepared(sql, [*fixed_params, *columns, *where_params])


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
