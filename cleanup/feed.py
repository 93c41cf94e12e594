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

from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max

from .models import FeedSequence, ModuleEvent, RunLog

# Entries given a place per stamping transaction: a burst larger than this is numbered
# over the next reads, in order.
STAMP_BATCH = 1000
FEED_KINDS = ("run", "module")


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


def stamp() -> int:
    """Give a place to up to `STAMP_BATCH` committed entries that have none; answers how many."""
    if not _unstamped():
        return 0
    with transaction.atomic():
        sequence = _locked_sequence()
        logs = list(RunLog.objects.filter(seq__isnull=True).order_by("id").only("id", "at")[:STAMP_BATCH])
        events = list(ModuleEvent.objects.filter(seq__isnull=True).order_by("id").only("id", "at")[:STAMP_BATCH])
        # Written order within the batch: by time, then by table and id.
        entries = sorted([(e.at, 0, e.id, e) for e in logs] + [(e.at, 1, e.id, e) for e in events])[:STAMP_BATCH]
        place: int = sequence.last
        for _, _, _, entry in entries:
            place += 1
            entry.seq = place
        RunLog.objects.bulk_update([e for _, _, _, e in entries if isinstance(e, RunLog)], ["seq"])
        ModuleEvent.objects.bulk_update([e for _, _, _, e in entries if isinstance(e, ModuleEvent)], ["seq"])
        FeedSequence.objects.filter(pk=1).update(last=place)
    return len(entries)


def position() -> int:
    """The highest place in the feed now: what follows it is what happens from now on."""
    stamp()
    sequence: int | None = FeedSequence.objects.filter(pk=1).values_list("last", flat=True).first()
    return sequence or 0


def entries_after(after: int, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` entries placed after ``after``, in place order, as dicts."""
    stamp()
    logs = RunLog.objects.filter(seq__gt=after).order_by("seq")[:limit]
    events = ModuleEvent.objects.filter(seq__gt=after).order_by("seq")[:limit]
    found: list[dict[str, Any]] = [
        {
            "id": e.seq,
            "at": e.at,
            "kind": e.kind,
            "source": "run",
            "run": e.run_id,
            "module": e.detail.get("module") if isinstance(e.detail.get("module"), str) else None,
            "backend": e.detail.get("backend") if isinstance(e.detail.get("backend"), str) else None,
            "detail": e.detail,
        }
        for e in logs
    ] + [
        {
            "id": e.seq,
            "at": e.at,
            "kind": e.kind,
            "source": "module",
            "run": None,
            "module": e.module,
            "backend": e.backend,
            "detail": e.detail,
        }
        for e in events
    ]
    found.sort(key=lambda entry: entry["id"])
    return found[:limit]


def release_connection() -> None:
    """Close the database connection between polls, unless a transaction holds it."""
    if not connection.in_atomic_block:
        connection.close()
