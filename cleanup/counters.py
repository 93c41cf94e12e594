"""Counters for the site's metrics, shared by every process through the database.

A process adds to its counters in memory (`add`, `observe` for a histogram of seconds),
from any thread, and `flush()` writes the sums: one upsert per counter, adding to what
is stored, so the counters of every gunicorn worker and every cluster process add up
whichever of them serves ``/metrics`` (`cleanup.metrics`). The app flushes at the end of
each task and each request, and when a process exits; nothing is lost but the sums of a
process killed before its next flush.
May import: the models.
"""

import atexit
import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

# The buckets of every histogram of seconds: module calls answer in milliseconds to the
# budget's seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_lock = threading.Lock()
# Each counter's key to [its name, its labels, the sum not yet written].
_pending: dict[str, list[Any]] = defaultdict(lambda: [None, None, 0.0])


def key_of(name: str, labels: Mapping[str, object]) -> str:
    """The counter's key: its name and labels as the metrics text writes them."""
    inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
    return f"{name}{{{inner}}}"


# A counter's key and its labels as text, by its name and labels as given: a module call
# counts the same few counters over and over, so each is made once (`_counter`). Only
# labels that are all text are kept: 1 and True are one key of a dict, not one text.
_known: dict[tuple[str, tuple[tuple[str, object], ...]], tuple[str, str, dict[str, str]]] = {}
KNOWN_MAX = 4096

# One addition: a counter's name, its labels, the amount.
Count = tuple[str, Mapping[str, object] | None, float]


def _counter(name: str, labels: Mapping[str, object] | None) -> tuple[str, str, dict[str, str]]:
    """A counter's key, its name and its labels as text."""
    given = (name, tuple(labels.items()) if labels else ())
    cached = all(type(v) is str for _, v in given[1])
    known = _known.get(given) if cached else None
    if known is None:
        texts = {k: str(v) for k, v in (labels or {}).items()}
        known = (key_of(name, texts), name, texts)
        if cached and len(_known) < KNOWN_MAX:
            _known[given] = known
    return known


def add(name: str, labels: Mapping[str, object] | None = None, amount: float = 1.0) -> None:
    add_all(((name, labels, amount),))


def add_all(counts: Iterable[Count]) -> None:
    """Several additions at once, under one hold of the lock (a module call's counter and
    histogram together)."""
    made = [(*_counter(name, labels), amount) for name, labels, amount in counts]
    with _lock:
        for key, name, labels, amount in made:
            entry = _pending[key]
            entry[0], entry[1] = name, labels
            entry[2] += amount


def observed(name: str, labels: Mapping[str, object], seconds: float) -> list[Count]:
    """One observation of a histogram, as additions (`add_all`): its bucket (the smallest
    ``le`` that holds it), sum and count."""
    le = next((_LE[b] for b in BUCKETS if seconds <= b), "+Inf")
    return [
        (f"{name}_bucket", {**labels, "le": le}, 1.0),
        (f"{name}_sum", labels, seconds),
        (f"{name}_count", labels, 1.0),
    ]


_LE = {b: str(b) for b in BUCKETS}


def observe(name: str, labels: Mapping[str, object], seconds: float) -> None:
    """One observation of a histogram (`observed`)."""
    add_all(observed(name, labels, seconds))


def pending() -> dict[str, tuple[Any, ...]]:
    with _lock:
        return {key: tuple(entry) for key, entry in _pending.items()}


def forget() -> None:
    """Drop what this process counted and did not write (a test's leftovers)."""
    with _lock:
        _pending.clear()


def flush(quiet: bool = False) -> int:
    """Write what this process counted since its last flush; never raises."""
    with _lock:
        taken = [(key, name, labels, value) for key, (name, labels, value) in _pending.items() if value]
        _pending.clear()
    if not taken:
        return 0
    from .models import Counter

    table = connection.ops.quote_name(Counter._meta.db_table)
    sql = (
        f"INSERT INTO {table} (key, name, labels, value) VALUES (%s, %s, %s, %s) "
        f"ON CONFLICT (key) DO UPDATE SET value = {table}.value + excluded.value"
    )
    try:
        with connection.cursor() as cursor:
            cursor.executemany(
                sql, [(key, name, json.dumps(labels, sort_keys=True), value) for key, name, labels, value in taken]
            )
    except DatabaseError:
        # Put them back: the next flush tries again.
        with _lock:
            for key, name, labels, value in taken:
                entry = _pending[key]
                entry[0], entry[1] = name, labels
                entry[2] += value
        if not quiet:
            logger.warning("could not write the metrics counters; the next flush tries again", exc_info=True)
        return 0
    return len(taken)


def flush_after_request(**kwargs: object) -> None:
    flush()


def _flush_at_exit() -> None:
    try:
        flush(quiet=True)
    except Exception:  # the database may be gone with the process
        pass


atexit.register(_flush_at_exit)
