"""The database's clock follows the tests' time travel.

The engine takes every time that decides from the database's clock (`cleanup.clock`), in
the statement itself. A test that travels in time with time_machine moves Python's clock,
not PostgreSQL's; while it travels, each statement sent on a test connection reads the
travelled time instead: ``STATEMENT_TIMESTAMP()`` is written as that time, to the
microsecond, so "the database's now" is what the test set, as it would be on a server
whose clock had reached that moment. Outside a travel, statements go as they are.
"""

import datetime as dt

import pytest
import time_machine
from django.db.backends.signals import connection_created

from cleanup import clock

_following = {"on": True}


def travelled(execute, sql, params, many, context):
    """An execute wrapper: the database's clock read as the travelled time while travelling."""
    following = _following["on"] and time_machine.escape_hatch.is_travelling()
    if following and isinstance(sql, str) and clock.SQL in sql:
        at = dt.datetime.now(dt.UTC).isoformat()
        sql = sql.replace(clock.SQL, f"'{at}'::timestamptz")
    return execute(sql, params, many, context)


def follow(sender, connection, **kwargs):
    """``connection_created``: every test connection follows the travel."""
    if travelled not in connection.execute_wrappers:
        connection.execute_wrappers.append(travelled)


connection_created.connect(follow, dispatch_uid="tests.clock.follow")


@pytest.fixture
def clocks_apart():
    """This worker's clock travels alone: the database keeps its own, as a worker machine
    whose clock is off sees it. Answers a function that moves this worker's clock by a
    number of seconds (from the real time) for the rest of the test."""
    travels = []

    def off_by(seconds):
        for travel in travels:
            travel.stop()
        travels.clear()
        travel = time_machine.travel(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds), tick=True)
        travel.start()
        travels.append(travel)

    _following["on"] = False
    try:
        yield off_by
    finally:
        for travel in travels:
            travel.stop()
        _following["on"] = True
