"""The change feed: the run log and the modules' log in one increasing sequence.

Each log entry is written as before, with no place in the feed (`seq` empty). Places are
given afterwards, by `stamp`, to entries already committed: under the lock of the one
`FeedSequence` row, each stamper reads the committed entries that have no place yet and
numbers them after the highest place given. So a place is never given to an entry that
a reader could still miss: an entry committed late (its transaction was long) is
numbered when it is committed, after everything a reader has already seen, never
before. A reader that asks for what came after the highest place it read misses
nothing and sees nothing twice, however the writers' transactions interleave.

Places increase but may have gaps: they are not counts. Every read of the feed, and
`position`, stamps first, so the feed is current whoever asks.
May import: the models.
"""

from collections.abc import Collection
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max

from .models import FeedSequence, ModuleEvent, RunLog

# Entries given a place per stamping transaction: a burst larger than this is numbered
# over the next reads, in order.
STAMP_BATCH = 1000
FEED_KINDS = ("run", "module")
# The PostgreSQL channel on which every write to either log is announced, on commit (a
# trigger on both tables: migration 0028); `cleanup.api.waiting` listens to it.
CHANNEL = "cleanup_feed"


def _locked_sequence() -> FeedSequence:
    """The `FeedSequence` row, locked for this transaction (made when missing)."""
    # The UPDATE takes the row's lock before anything is read, so two stampers never
    # number from the same place.
    if not FeedSequence.objects.filter(pk=1).update(last=F("last")):
        highest = max(
            RunLog.objects.aggregate(m=Max("seq"))["m"] or 0,
            ModuleEvent.objects.aggregate(m=Max("seq"))["m"] or 0,
        )
        try:
            with transaction.atomic():
                FeedSequence.objects.create(pk=1, last=highest)
        except IntegrityError:
            pass  # another stamper made it meanwhile
        FeedSequence.objects.filter(pk=1).update(last=F("last"))
    return FeedSequence.objects.get(pk=1)


def _unstamped() -> bool:
    return RunLog.objects.filter(seq__isnull=True).exists() or ModuleEvent.objects.filter(seq__isnull=True).exists()


# Locks the sequence's row: the first statement of a stamping transaction.
LOCK_SQL = "UPDATE cleanup_feedsequence SET last = last WHERE id = 1"
# Then, in the same transaction: up to `batch` committed entries without a place, numbered
# after the highest place given, in written order (by time, then by table and id); answers
# how many. (Also run by the listener of `cleanup.api.waiting` on its own connection.)
STAMP_SQL = """
WITH todo AS (
    (SELECT 0 AS source, id, at FROM cleanup_runlog WHERE seq IS NULL ORDER BY id LIMIT %(batch)s)
    UNION ALL
    (SELECT 1 AS source, id, at FROM cleanup_moduleevent WHERE seq IS NULL ORDER BY id LIMIT %(batch)s)
), numbered AS (
    SELECT source, id, (SELECT last FROM cleanup_feedsequence WHERE id = 1)
        + row_number() OVER (ORDER BY at, source, id) AS place
    FROM todo ORDER BY at, source, id LIMIT %(batch)s
), logs AS (
    UPDATE cleanup_runlog SET seq = numbered.place FROM numbered
    WHERE numbered.source = 0 AND cleanup_runlog.id = numbered.id
), events AS (
    UPDATE cleanup_moduleevent SET seq = numbered.place FROM numbered
    WHERE numbered.source = 1 AND cleanup_moduleevent.id = numbered.id
)
UPDATE cleanup_feedsequence SET last = coalesce((SELECT max(place) FROM numbered), last) WHERE id = 1
RETURNING (SELECT count(*) FROM numbered)
"""
# The entries placed after `after`, in place order, as `as_entry` lists them (the listener's read).
ENTRIES_SQL = """
(SELECT seq, at, kind, 'run' AS source, run_id, detail, NULL AS module, NULL AS backend
 FROM cleanup_runlog WHERE seq > %(after)s ORDER BY seq LIMIT %(limit)s)
UNION ALL
(SELECT seq, at, kind, 'module', NULL, detail, module, backend
 FROM cleanup_moduleevent WHERE seq > %(after)s ORDER BY seq LIMIT %(limit)s)
ORDER BY seq LIMIT %(limit)s
"""


def entry_of_row(row: tuple[Any, ...]) -> dict[str, Any]:
    """An `ENTRIES_SQL` row as the feed lists it."""
    seq, at, kind, source, run_id, detail, module, backend = row
    if source == "run":
        module = detail.get("module") if isinstance(detail.get("module"), str) else None
        backend = detail.get("backend") if isinstance(detail.get("backend"), str) else None
    return {
        "id": seq,
        "at": at,
        "kind": kind,
        "source": source,
        "run": run_id,
        "module": module,
        "backend": backend,
        "detail": detail,
    }


def stamp() -> int:
    """Give a place to up to `STAMP_BATCH` committed entries that have none; answers how many."""
    if not _unstamped():
        return 0
    with transaction.atomic():
        _locked_sequence()
        with connection.cursor() as cursor:
            cursor.execute(STAMP_SQL, {"batch": STAMP_BATCH})
            row = cursor.fetchone()
    return int(row[0]) if row else 0


# Whether any entry waits for a place, and the highest place given: one query.
POSITION_SQL = (
    "SELECT EXISTS (SELECT 1 FROM cleanup_runlog WHERE seq IS NULL)"
    " OR EXISTS (SELECT 1 FROM cleanup_moduleevent WHERE seq IS NULL),"
    " (SELECT last FROM cleanup_feedsequence WHERE id = 1)"
)


def placed() -> int:
    """The highest place given so far, placing nothing: an entry committed but not placed yet
    gets a place after it. What a list answers as where the feed stood (one query)."""
    sequence: int | None = FeedSequence.objects.filter(pk=1).values_list("last", flat=True).first()
    return sequence or 0


def position() -> int:
    """The highest place in the feed now: what follows it is what happens from now on."""
    with connection.cursor() as cursor:
        cursor.execute(POSITION_SQL)
        row = cursor.fetchone()
    if row and not row[0]:
        return int(row[1] or 0)
    stamp()
    sequence: int | None = FeedSequence.objects.filter(pk=1).values_list("last", flat=True).first()
    return sequence or 0


def entries_after(
    after: int, limit: int, run: int | None = None, kinds: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """Up to ``limit`` entries placed after ``after``, in place order, as dicts; only those
    of ``run`` (a run log's entries) and of one of ``kinds``, when given."""
    stamp()
    logs = RunLog.objects.filter(seq__gt=after)
    events = ModuleEvent.objects.filter(seq__gt=after)
    if run is not None:
        logs = logs.filter(run_id=run)
        events = events.none()
    if kinds is not None:
        logs = logs.filter(kind__in=list(kinds))
        events = events.filter(kind__in=list(kinds))
    found: list[dict[str, Any]] = [as_entry(e) for e in logs.order_by("seq")[:limit]] + [
        as_entry(e) for e in events.order_by("seq")[:limit]
    ]
    found.sort(key=lambda entry: entry["id"])
    return found[:limit]


def as_entry(row: RunLog | ModuleEvent) -> dict[str, Any]:
    """A log row as the feed lists it."""
    if isinstance(row, RunLog):
        detail = row.detail
        return {
            "id": row.seq,
            "at": row.at,
            "kind": row.kind,
            "source": "run",
            "run": row.run_id,
            "module": detail.get("module") if isinstance(detail.get("module"), str) else None,
            "backend": detail.get("backend") if isinstance(detail.get("backend"), str) else None,
            "detail": detail,
        }
    return {
        "id": row.seq,
        "at": row.at,
        "kind": row.kind,
        "source": "module",
        "run": None,
        "module": row.module,
        "backend": row.backend,
        "detail": row.detail,
    }


def matches(entry: dict[str, Any], run: int | None, kinds: Collection[str] | None) -> bool:
    """Whether ``entry`` is one `entries_after` lists with these filters."""
    return (run is None or (entry["source"] == "run" and entry["run"] == run)) and (
        kinds is None or entry["kind"] in kinds
    )


def release_connection() -> None:
    """Close the database connection between polls, unless a transaction holds it."""
    if not connection.in_atomic_block:
        connection.close()
