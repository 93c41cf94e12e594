"""Set-based writes for the batch's hot path: many rows in one statement, little Python.

On PostgreSQL the values travel as one array per column and ``unnest`` turns them back
into rows, so a batch of a thousand rows costs one statement and no per-row SQL.
Elsewhere (SQLite, the embedded demo) the same writes go through the ORM.
May import: `statements` only.
"""

from django.db import connection

from . import statements


def _arrays(model, names, rows):
    """One list per field of ``names``, each value prepared as the field saves it."""
    fields = [model._meta.get_field(name) for name in names]
    columns = [[_plain(field.get_db_prep_save(row[i], connection)) for row in rows] for i, field in enumerate(fields)]
    types = [f"{field.db_type(connection)}[]" for field in fields]
    return fields, columns, types


def insert(objects, names):
    """Insert model instances (of one model, no primary key set) with the fields ``names``.

    What ``bulk_create`` does, without its per-object work: the batch's log entries and
    attempts are written by every pass.
    """
    objects = list(objects)
    if not objects:
        return
    model = type(objects[0])
    if connection.vendor != "postgresql":
        model.objects.bulk_create(objects)
        return
    rows = [[getattr(obj, model._meta.get_field(name).attname) for name in names] for obj in objects]
    fields, columns, types = _arrays(model, names, rows)
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"SELECT * FROM unnest({', '.join(f'%s::{t}' for t in types)})"
    )
    statements.execute_prepared(sql, columns)


def update_by_id(model, changes, where, where_params, expressions=None, fixed=None, key=None):
    """Give each row its own values in one UPDATE; answers the number of rows changed.

    ``changes`` maps a row's id to ``{field name: value}``; a row leaves the fields it does
    not name as they are. With ``key`` (a foreign key's name) it maps that key's value
    instead, and every row with that value takes the values. ``expressions`` maps a field
    name to SQL used instead of the value when a row names the field with the value
    ``SPECIAL`` (with ``r`` the row as it was, ``v`` its new values). ``fixed`` sets fields
    to one value on every matched row. ``where`` (SQL on ``r``) fences the write, e.g. to
    the rows a claim still holds.
    PostgreSQL only: callers on other databases write through the ORM.
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
        special = f"WHEN v.special{i} THEN {expressions[name].format(v=f'v.v{i}')} " if name in expressions else ""
        sets.append(f"{column} = CASE {special}WHEN v.set{i} THEN v.v{i} ELSE r.{column} END")
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
    return statements.execute_prepared(sql, [*fixed_params, *columns, *where_params])


def _plain(value):
    """A choices member (a ``str`` subclass) as the plain string the driver adapts."""
    return str(value) if isinstance(value, str) and type(value) is not str else value


class _Keep:
    def __repr__(self):
        return "KEEP"


class _Special:
    def __repr__(self):
        return "SPECIAL"


_KEEP = _Keep()
SPECIAL = _Special()
