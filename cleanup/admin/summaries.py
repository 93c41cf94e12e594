"""What a ledger row is, and what a running run holds, in words a person on shift reads.

A module's payload is its own, so the words come from the keys modules commonly use: what
a row is (``creature``, ``entity``, ``item``, ``setting``, ``type``, ``name``, ...) and where
(``at``, ``place``, ``where``; a position as its coordinates); a lease row reads as its
target, its baseline and the value applied. A run's holdings are counted from its
unresolved rows in one bounded query, and summed up as "20 orc and 2 troll at north-gate; spawner orc-camp 1.0 → 5.0".

May import models; nothing of the engine imports it (the admin's pages do).
"""

from collections import Counter
from collections.abc import Iterable, Mapping

from ..models import UNRESOLVED, Resource

# The payload keys a row's words come from, in the order they are looked for.
WHAT_KEYS = ("creature", "entity", "mob", "item", "node", "setting", "type", "name", "what")
WHERE_KEYS = ("at", "place", "where", "location")
# How many of a run's unresolved rows its summary reads: past it, "and more".
HOLDINGS_ROWS = 2_000
HOLDINGS_PARTS = 6


def _word(value: object) -> str | None:
    if isinstance(value, list | tuple) and 0 < len(value) <= 4 and all(_scalar(v) for v in value):
        return ",".join(str(v) for v in value)[:60]  # a position: 12,8,-40
    return str(value)[:60] if _scalar(value) else None


def _scalar(value: object) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def lease_target(ref: str) -> str:
    """A lease row's target: its ref is ``<lease id>#<target>``."""
    return ref.split("#", 1)[1] if "#" in ref else ref


def row_what(kind: str, ref: str, payload: object) -> str:
    """What a row is, in a few words: ``orc at north-gate``, ``orc-camp 1.0 → 5.0``, or its kind."""
    payload = payload if isinstance(payload, dict) else {}
    if kind == "override":
        baseline, applied = payload.get("baseline"), payload.get("applied")
        return f"{lease_target(ref)} {baseline} → {applied}"
    what = next((w for k in WHAT_KEYS if (w := _word(payload.get(k)))), None)
    where = next((w for k in WHERE_KEYS if (w := _word(payload.get(k)))), None)
    if what and where:
        return f"{what} at {where}"
    return what or (f"{kind} at {where}" if where else kind)


def _counted(what_where: Mapping[tuple[str, str], int]) -> list[str]:
    """``{(what, where): n}`` to "20 orc and 2 troll at north-gate; 3 goblin at south-gate"."""
    by_place: dict[str, list[str]] = {}
    for (what, where), n in what_where.items():
        by_place.setdefault(where, []).append(f"{n} {what}")
    parts = [" and ".join(items) + (f" at {where}" if where else "") for where, items in by_place.items()]
    return parts


def holdings(run_ids: Iterable[int]) -> dict[int, str]:
    """``{run_id: "20 orc and 2 troll at north-gate; orc-camp 1.0 → 5.0"}`` for each run that holds something.

    One query over the unresolved rows of these runs (their partial index), at most
    `HOLDINGS_ROWS` rows read; a step's placeholder is not something a run holds.
    """
    rows = (
        Resource.objects.filter(run_id__in=list(run_ids), state__in=UNRESOLVED)
        .exclude(kind="step")
        .order_by("id")
        .values_list("run_id", "kind", "ref", "payload")[:HOLDINGS_ROWS]
    )
    counted: dict[int, Counter[tuple[str, str]]] = {}
    leases: dict[int, list[str]] = {}
    seen = 0
    for run_id, kind, ref, payload in rows:
        seen += 1
        if kind == "override":
            leases.setdefault(run_id, []).append(row_what(kind, ref, payload))
            continue
        words = row_what(kind, ref, payload)
        what, _, where = words.partition(" at ")
        counted.setdefault(run_id, Counter())[(what, where)] += 1
    found: dict[int, str] = {}
    for run_id in {*counted, *leases}:
        parts = _counted(counted.get(run_id, {})) + leases.get(run_id, [])
        more = len(parts) - HOLDINGS_PARTS
        text = "; ".join(parts[:HOLDINGS_PARTS]) + (f"; and {more} more" if more > 0 else "")
        found[run_id] = text + ("; and more" if seen >= HOLDINGS_ROWS else "")
    return found
