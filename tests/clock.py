"""The database's clock follows the tests' time travel.

The engine takes every time that decides from the database's clock (`cleanup.clock`), in
the statement itself. A test that travels in time with time_machine moves Python's clock,
not PostgreSQL's; while it travels, each statement sent on a test connection reads the
travelled time instead: ``STATEMENT_TIMESTAMP()`` is written as that time, to the
microsecond, so "the database's now" is what the test set, as it would be on a server
whose clock had reached that moment. Outside a travel, statements go as they are.
"""

import datetime as dt

import time_machine
from django.db.backends.signals import connection_created

from cleanup import clock


def travelled(execute, sql, params, many, context):
    """An execute wrapper: the database's clock read as the travelled time while travelling."""
    if isinstance(sql, str) and clock.SQL in sql and time_machine.escape_hatch.is_travelling():
        at = dt.datetime.now(dt.UTC).isoformat()
        sql = sql.replace(clock.SQL, f"'{at}'::timestamptz")
    return execute(sql, params, many, context)


def follow(sender, connection, **kwargs):
    """``connection_created``: every test connection follows the travel."""
    if travelled not in connection.execute_wrappers:
        connection.execute_wrappers.append(travelled)


connection_created.connect(follow, dispatch_uid="tests.clock.follow")
