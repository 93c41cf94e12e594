"""How far each worker's clock is from the database's: measured, recorded, shown.

Every time that decides who may act on a ledger row is the database's (``STATEMENT_TIMESTAMP()``,
`cleanup.clock`), so a worker whose clock is off changes no decision: only the times in its
own log lines are off. To see it, each cluster records its clock's offset from the
database's (`WorkerClock`, one row per cluster and machine) when a worker starts and on
each tick, in one statement; ``/healthz?detail=1``, the module health page and a system
check (`cleanup.checks`, W032) show it, flagged past `WARN_S`.

The offset is the local clock minus the database's, in seconds: positive when the worker
is ahead. `measure` brackets one query with the local clock and answers the midpoint;
`record` stamps the reading with the time the statement left, so it reads low by at most
the way there (a millisecond on a LAN; the warning is at 5 s).
May import: the models.
"""

import datetime as dt
import socket
import time
from dataclasses import dataclass

from django.db import connections
from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import Now

from .models import WorkerClock

# Past this many seconds either way, an offset is flagged, and the system check warns.
WARN_S = 5.0
# A cluster's reading is shown and checked while it is this recent (a running cluster
# records at least on each tick it runs, a minute apart among the clusters); older
# readings are those of a cluster that stopped.
RECENT = dt.timedelta(hours=1)
# Readings older than this are deleted by the scheduled prune (`cleanup.tasks.prune_task`).
KEPT = dt.timedelta(days=7)


@dataclass(frozen=True)
class Measurement:
    offset_s: float  # the local clock minus the database's
    round_trip_s: float  # how long the query took: the offset is within half of it
    database_at: dt.datetime  # the database's time of the reading

    @property
    def off(self) -> bool:
        return abs(self.offset_s) > WARN_S


def measure(using: str = "default") -> Measurement:
    """This process's clock against the database's: one query, bracketed by the local clock."""
    with connections[using].cursor() as cursor:
        before = time.time()
        cursor.execute("SELECT STATEMENT_TIMESTAMP()")
        after = time.time()
        (database_at,) = cursor.fetchone()
    return Measurement((before + after) / 2 - database_at.timestamp(), after - before, database_at)


def who() -> str:
    """This process's cluster and machine, as its reading is recorded: the clusters of one
    site share django-q2's name, each machine has its own clock."""
    from django_q.conf import Conf

    return f"{Conf.CLUSTER_NAME} on {socket.gethostname()}"[: WorkerClock._meta.get_field("who").max_length]


_RECORD = """
INSERT INTO {table} (who, offset_s, measured_at)
VALUES (%s, %s - EXTRACT(EPOCH FROM STATEMENT_TIMESTAMP())::double precision, STATEMENT_TIMESTAMP())
ON CONFLICT (who) DO UPDATE SET offset_s = EXCLUDED.offset_s, measured_at = EXCLUDED.measured_at
RETURNING offset_s
"""


def record(name: str | None = None) -> float:
    """Measure this process's clock and store it as ``name``'s (this cluster's by default)
    latest reading: one statement, that reads the database's clock and writes the offset.
    Answers the offset."""
    table = WorkerClock._meta.db_table
    with connections["default"].cursor() as cursor:
        cursor.execute(_RECORD.format(table=table), [name or who(), time.time()])
        (offset,) = cursor.fetchone()
    offset_s: float = offset
    return offset_s


def readings() -> QuerySet[WorkerClock]:
    """The clusters' recent readings, each with its ``age`` on the database's clock."""
    age = ExpressionWrapper(Now() - F("measured_at"), output_field=DurationField())
    return WorkerClock.objects.filter(measured_at__gte=Now() - RECENT).annotate(age=age).order_by("who")


def forget_old() -> int:
    """Delete the readings of clusters gone for longer than `KEPT`; answers how many."""
    deleted: int = WorkerClock.objects.filter(measured_at__lt=Now() - KEPT).delete()[0]
    return deleted


def line(reading: WorkerClock, stamped: bool = False) -> str:
    """One cluster's reading as staff read it: ``events on host-a +0.3 s (measured 12 s
    ago)``, flagged past `WARN_S`; ``stamped`` adds the database's time of the reading."""
    age = getattr(reading, "age", None)
    when = [f"{reading.measured_at:%Y-%m-%d %H:%M:%S} UTC"] if stamped or age is None else []
    when += [f"measured {max(age.total_seconds(), 0):.0f} s ago"] if age is not None else []
    flag = f" - more than {WARN_S:g} s off" if abs(reading.offset_s) > WARN_S else ""
    return f"{reading.who} {reading.offset_s:+.1f} s ({', '.join(when)}){flag}"
