"""The database's clock: the one clock every decision about a ledger row, a run or a backend
is taken on (rule 9).

Several worker machines share one database, and their clocks disagree: by seconds when NTP
is late, by minutes when it is broken. A claim stamped with one worker's clock and judged
expired by another's lets two sweepers call a module for the same rows at once. So every
time that decides who may act (a claim's expiry and its renewal, a takeover, a backoff, a
wait on a down backend, a probe, a wake-up, a run's claim, a lease's hand-down, the
dead-man's switch's renewal age) is stamped and compared on the database's clock:

- in the statement that decides, as SQL (`SQL`, `at`, `after`): the database reads its
  own clock when it runs the statement, and no worker's time travels with it;
- where the engine must hold a time in hand (to compute with, to log, to show), it reads
  the database's (`now`, one query), never ``timezone.now()``.

A worker whose clock is off changes nothing but the times in its own log lines; how far
off each cluster's clock is, is measured and shown (`cleanup.skew`).
May import: Django only.
"""

from __future__ import annotations

import datetime as dt

from django.db import connection
from django.db.models import DateTimeField, Expression, ExpressionWrapper, Value
from django.db.models.functions import Now

# The database's time when it runs a statement. Django's `Now` compiles to the same on
# PostgreSQL, so the engine's SQL and the ORM's queries read one clock.
SQL = "STATEMENT_TIMESTAMP()"


def at() -> Now:
    """The database's time, as an expression of the statement that uses it."""
    return Now()


def after(delay: dt.timedelta | float) -> Expression:
    """The database's time plus ``delay`` (a timedelta or seconds), as an expression."""
    if not isinstance(delay, dt.timedelta):
        delay = dt.timedelta(seconds=delay)
    return ExpressionWrapper(Now() + Value(delay), output_field=DateTimeField())


def sql_after(param: str = "%s") -> str:
    """SQL for the database's time plus a number of seconds given as ``param``."""
    return f"({SQL} + {param}::double precision * interval '1 second')"


def now() -> dt.datetime:
    """The database's time, read now: for a time the engine computes with or writes beside
    others in a later statement. One query."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {SQL}")
        (value,) = cursor.fetchone()
    when: dt.datetime = value
    return when
