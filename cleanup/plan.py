"""A run's cleanup plan: what the next pass would do, read without doing any of it (rule 12).

The plan tells apart the work the next pass will do from the rows waiting for a person
(no attempt left, not retryable, drifted), and says for each lease what will happen to
its target: restored, its baseline handed down to a newer lease (rule 13), or left
alone because someone else's value is in place. On request it reads the live value of
each leased target through the lease's ``read``, under the lease's budget.

Live reads are bounded per request, whatever the run's size: at most
``EVENT_LIVE_READS_PER_REQUEST`` of them, made concurrently (at most
``EVENT_CALL_CONCURRENCY`` at once to one backend of a module, or the lease's own
``max_concurrency``), all within ``EVENT_LIVE_READ_BUDGET_S``. A value that was not read
(past the cap, or the budget ran out first) is answered as ``{"unread": why}``, and the
plan says which (`unread_ids`), so no request waits on a slow shard for longer than
the budget and none makes more reads than the cap.
May import: the models, conf, `calls`, `registry`, `cleanup.rows`, `outages` (which backends are down).
Reads only.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any, NotRequired, TypedDict

from django.db.models import Q
from django.utils import timezone

from . import calls, outages, registry
from . import rows as ledger_rows
from .calls import Answer
from .conf import max_revert_attempts, setting
from .models import LEASE_KIND, UNRESOLVED, Resource, ResourceState, Run
from .registry import Lease

# What the next pass does with a group.
RESTORE = "restore"
HAND_DOWN = "hand down"
REVERT = "revert"
LEAVE = "leave (drifted)"
WAITING = "waiting for a person"
WAITING_BACKEND = "waiting for its backend"
IN_HAND = "being given back now"
# The same, as the API names them: a code a console can branch on (PlanGroup.next).
NEXT_CODES = {
    RESTORE: "restore",
    HAND_DOWN: "hand_down",
    REVERT: "revert",
    LEAVE: "leave_drifted",
    WAITING: "waiting_for_person",
    WAITING_BACKEND: "waiting_for_backend",
    IN_HAND: "being_given_back",
}


class LiveValue(TypedDict, total=False):
    """A leased target's value as read now: exactly one of its keys."""

    value: Any  # the module's value, whatever it is (a lease's values are the module's)
    error: str
    unread: str


class HandDown(TypedDict):
    """The newer lease a lease's baseline would be handed down to (rule 13)."""

    resource: int
    run: int


class PlanLease(TypedDict):
    baseline: Any  # the module's values, as the lease row's payload keeps them
    applied: Any
    hand_down_to: HandDown | None
    live: NotRequired[LiveValue]


class PlanRow(TypedDict):
    id: int
    kind: str
    ref: str
    state: str
    attempts: int
    attempts_left: int
    last_error: str
    lease: NotRequired[PlanLease]


class PlanGroup(TypedDict):
    """One group of the plan: the call the next pass makes (or the problem why none), what it
    does with the group (one of the words above), and the group's rows."""

    verb: str | None
    problem: str | None
    next: str
    rows: list[PlanRow]


# A group's key in the plan's order: ``(rank, id)`` (see `group_keys`).
GroupKey = tuple[int, int]


def cleanup_plan(run: Run, *, live: bool = False, max_rows: int | None = None) -> list[PlanGroup]:
    """What a pass would do for a run now, group by group (rule 12). Reads only.

    ``max_rows`` caps how many unresolved rows are read (the oldest first), so a run with
    a great many rows is planned in bounded time; ``live`` also reads each lease's target.
    """
    max_attempts = max_revert_attempts()
    found = Resource.objects.filter(run=run, state__in=UNRESOLVED).select_related("step").order_by("id")
    if max_rows is not None:
        found = found[:max_rows]
    rows = list(found)
    return _planned(run, rows, _groups(rows), max_attempts, live)


def _planned(
    run: Run, rows: Sequence[Resource], groups: Iterable[list[Resource]], max_attempts: int, live: bool
) -> list[PlanGroup]:
    """Each group's entry of the plan, in the order given; with ``live``, the leases' values
    read now, bounded for the request (`read_live_many`)."""
    newer = _newer_leases(run, [r for r in rows if r.kind == LEASE_KIND])
    down: dict[Any, str] = outages.waiting_reasons({(r.module, r.backend) for r in rows}) if rows else {}
    plan: list[PlanGroup] = []
    for group in groups:
        verb, problem = _verb(group[0])
        entries = [_row(r, max_attempts, newer) for r in group]
        waits = (group[0].module, group[0].backend) in down
        plan.append(
            {"verb": verb, "problem": problem, "next": _next(group[0], entries, verb, newer, waits), "rows": entries}
        )
    if live:
        values = read_live_many([(r.pk, r.ref, r.backend) for r in rows if r.kind == LEASE_KIND])
        for planned in plan:
            for entry in planned["rows"]:
                if entry["id"] in values and "lease" in entry:
                    entry["lease"]["live"] = values[entry["id"]]
    return plan


def unread_ids(plan: Iterable[PlanGroup]) -> list[int]:
    """The ids of the plan's lease rows whose live value was asked for and not read."""
    return [entry["id"] for group in plan for entry in group["rows"] if "unread" in _live_of(entry)]


def _live_of(entry: PlanRow) -> LiveValue:
    lease = entry.get("lease")
    return lease.get("live", {}) if lease is not None else {}


# A group's key in the plan's order: leases first, then a step's rows, then loose rows.
LEASE_GROUP, STEP_GROUP, LOOSE_GROUP = 0, 1, 2


def group_keys(run: Run) -> list[GroupKey]:
    """Every group of the run's unresolved rows, as ``(rank, id)`` in the plan's order.

    A lease is its row's id; a step's rows, the step's id; a loose row, its own id. Reads
    ids only, so a console can page through a plan of any size (`plan_of_groups`).
    """
    rows = Resource.objects.filter(run=run, state__in=UNRESOLVED).values_list("id", "kind", "step_id")
    keys: set[GroupKey] = set()
    for pk, kind, step_id in rows:
        if kind == LEASE_KIND:
            keys.add((LEASE_GROUP, pk))
        elif step_id is not None:
            keys.add((STEP_GROUP, step_id))
        else:
            keys.add((LOOSE_GROUP, pk))
    return sorted(keys)


def plan_of_groups(run: Run, keys: Sequence[Sequence[int]], *, live: bool = False) -> list[PlanGroup]:
    """The plan of the groups ``keys`` (from `group_keys`) alone, in their order. Reads only."""
    max_attempts = max_revert_attempts()
    single = [pk for rank, pk in keys if rank != STEP_GROUP]
    steps = [pk for rank, pk in keys if rank == STEP_GROUP]
    rows = list(
        Resource.objects.filter(run=run, state__in=UNRESOLVED)
        .filter(Q(pk__in=single) | (Q(step_id__in=steps) & ~Q(kind=LEASE_KIND)))
        .select_related("step")
        .order_by("id")
    )
    by_key: dict[tuple[int, ...], list[Resource]] = {}
    for row in rows:
        key: tuple[int, ...]
        if row.kind == LEASE_KIND or row.step_id is None:
            key = (LEASE_GROUP if row.kind == LEASE_KIND else LOOSE_GROUP, row.pk)
        else:
            key = (STEP_GROUP, row.step_id)
        by_key.setdefault(key, []).append(row)
    # A group resolved since the keys were read is left out.
    groups = [by_key[tuple(key)] for key in keys if by_key.get(tuple(key))]
    return _planned(run, rows, groups, max_attempts, live)


def _groups(rows: Iterable[Resource]) -> list[list[Resource]]:
    """Leases first, one group each; then a step's rows together; then loose rows."""
    leases: list[list[Resource]] = []
    by_step: dict[int, list[Resource]] = {}
    loose: list[list[Resource]] = []
    for row in rows:
        if row.kind == LEASE_KIND:
            leases.append([row])
        elif row.step_id is None:
            loose.append([row])
        else:
            by_step.setdefault(row.step_id, []).append(row)
    return leases + list(by_step.values()) + loose


def _verb(first: Resource) -> tuple[str, None] | tuple[None, str]:
    if first.kind == LEASE_KIND:
        lease, _ = registry.lease_for_ref(first.ref)
        if lease is None:
            return None, f'no module registers the lease "{first.ref}"'
        return f"{lease.id}.restore", None
    action = registry.get_action(first.action_id) if first.action_id else None
    if action is not None and callable(getattr(action, "revert", None)):
        return f"{first.action_id}.revert", None
    return None, f'no module can give back what "{first.action_id}" made'


def _next(
    first: Resource,
    entries: Sequence[PlanRow],
    verb: str | None,
    newer: dict[int, HandDown],
    backend_down: bool = False,
) -> str:
    """What the next pass does with this group; a group with no attempt left waits for a person,
    one whose backend is down waits for it (the sweep does not try it, and spends no attempt)."""
    if first.state == ResourceState.DRIFTED:
        return LEAVE
    if first.state == ResourceState.REVERTING:
        # A dead claim at the ceiling whose call started is released as failed (rule 20).
        tried_again = ledger_rows.tried_again(timezone.now(), max_revert_attempts())
        return IN_HAND if ledger_rows.holds(first, tried_again) else WAITING
    if verb is None or not any(e["attempts_left"] for e in entries):
        return WAITING
    if backend_down:
        return WAITING_BACKEND
    if first.kind == LEASE_KIND:
        return HAND_DOWN if first.pk in newer else RESTORE
    return REVERT


def _newer_leases(run: Run, lease_rows: Sequence[Resource]) -> dict[int, HandDown]:
    """For each lease row, the lease it would hand down to (rule 13): `rows.heir`, as the
    pass chooses it, among the unresolved leases on its target (on its backend)."""
    if not lease_rows:
        return {}
    by_target: dict[tuple[str, str], list[Resource]] = {}
    stacked = (
        Resource.objects.filter(kind=LEASE_KIND, ref__in={r.ref for r in lease_rows}, state__in=UNRESOLVED)
        .order_by("id")
        .only("id", "ref", "backend", "run_id", "payload")
    )
    for other in stacked:  # in id order: each target's list is sorted
        by_target.setdefault((other.ref, other.backend), []).append(other)
    heirs: dict[int, HandDown] = {}
    for row in lease_rows:
        heir = ledger_rows.heir(row, by_target.get((row.ref, row.backend), ()))
        if heir is not None:
            heirs[row.pk] = {"resource": heir.pk, "run": heir.run_id}
    return heirs


def _row(r: Resource, max_attempts: int, newer: dict[int, HandDown]) -> PlanRow:
    entry: PlanRow = {
        "id": r.pk,
        "kind": r.kind,
        "ref": r.ref,
        "state": r.state,
        "attempts": r.revert_attempts,
        "attempts_left": ledger_rows.attempts_left_of(r, max_attempts),
        "last_error": r.last_error,
    }
    if r.kind == LEASE_KIND:
        payload = r.payload if isinstance(r.payload, dict) else {}
        entry["lease"] = {
            "baseline": payload.get("baseline"),
            "applied": payload.get("applied"),
            "hand_down_to": newer.get(r.pk),
        }
    return entry


def read_live(ref: str, backend: str = "") -> LiveValue:
    """The value in force on a lease's target now, read through the lease under its budget.

    Answers ``{"value": v}``, ``{"error": text}`` or ``{"unread": why}``; an answer that
    is not exactly a success with a value is an error, never a value.
    """
    return read_live_many([(None, ref, backend)])[None]


def read_live_many(
    targets: Iterable[tuple[Any, str, str]], *, cap: int | None = None, budget_s: float | None = None
) -> dict[Any, LiveValue]:
    """Read the live values of leased targets concurrently, bounded for one request.

    ``targets`` are ``(key, ref, backend)``; answers ``{key: {"value"} | {"error"} |
    {"unread"}}``. At most ``cap`` reads are made (``EVENT_LIVE_READS_PER_REQUEST``), the
    first targets first; every read ends by ``budget_s`` (``EVENT_LIVE_READ_BUDGET_S``)
    from now, each under the smaller of its lease's budget and the time left. A read cut
    short by the request's budget, or never started, is ``unread``, not an error: the
    module was not found wanting, the request ran out of time.
    """
    cap = setting("EVENT_LIVE_READS_PER_REQUEST") if cap is None else cap
    budget_s = setting("EVENT_LIVE_READ_BUDGET_S") if budget_s is None else budget_s
    deadline = time.monotonic() + budget_s
    answers: dict[Any, LiveValue] = {}
    pending: list[_Read] = []
    for key, ref, backend in targets:
        lease, target = registry.lease_for_ref(ref)
        if lease is None:
            answers[key] = {"error": f'no module registers the lease "{ref}"'}
        elif len(pending) >= cap:
            answers[key] = {
                "unread": f"not read: at most {cap} live values are read per request (EVENT_LIVE_READS_PER_REQUEST)"
            }
        else:
            pending.append(_Read(key, lease, target, backend))
    _LiveReads(pending, deadline, budget_s).run(answers)
    return answers


class _Read:
    # ``key`` is the caller's name for the target (a row id, or None for one read alone).
    def __init__(self, key: Any, lease: Lease, target: str, backend: str) -> None:
        self.key, self.lease, self.target, self.backend = key, lease, target, backend
        self.what = f"{lease.id}.read"
        self.slot = (lease.module, backend)
        own = getattr(lease, "max_concurrency", None)
        limit = setting("EVENT_CALL_CONCURRENCY")
        self.limit = min(limit, own) if isinstance(own, int) and own > 0 else limit


class _LiveReads:
    """One request's reads in flight: started as the limits allow, landed as they answer."""

    def __init__(self, pending: Iterable[_Read], deadline: float, budget_s: float) -> None:
        self.pending, self.deadline, self.budget_s = list(pending), deadline, budget_s
        # Each read's future, when its budget ends, and whether the request's deadline cut it.
        self.flying: dict[_Read, tuple[Future[Answer], float, bool]] = {}
        self.per_slot: Counter[tuple[str | None, str]] = Counter()
        self.woken = threading.Event()

    def run(self, answers: dict[Any, LiveValue]) -> None:
        while self.pending or self.flying:
            self.woken.clear()
            self.start()
            self.land(answers)
            if time.monotonic() >= self.deadline:
                for read in self.pending:
                    answers[read.key] = {"unread": self._ran_out()}
                self.pending = []
            if self.flying:
                soonest = min(expires for _f, expires, _cut in self.flying.values())
                self.woken.wait(max(0.0, soonest - time.monotonic()))

    def start(self) -> None:
        for read in list(self.pending):
            left_ms = int((self.deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return
            if self.per_slot[read.slot] >= read.limit:
                continue
            self.pending.remove(read)
            self.per_slot[read.slot] += 1
            own_ms = calls.budget_of(read.lease)
            budget_ms = min(own_ms, left_ms)
            future = calls.start(read.lease.read, what=read.what, backend=read.backend, target=read.target)
            future.add_done_callback(lambda _f: self.woken.set())
            self.flying[read] = (future, time.monotonic() + budget_ms / 1000, budget_ms < own_ms)

    def land(self, answers: dict[Any, LiveValue]) -> None:
        for read, (future, expires, cut) in list(self.flying.items()):
            if future.done():
                answers[read.key] = _value_of(read, future.result())
            elif time.monotonic() >= expires:
                own_ms = calls.budget_of(read.lease)
                answers[read.key] = (
                    {"unread": self._ran_out()} if cut else {"error": f"{read.what} did not answer within {own_ms} ms"}
                )
            else:
                continue
            del self.flying[read]
            self.per_slot[read.slot] -= 1

    def _ran_out(self) -> str:
        return f"not read: the request's {self.budget_s} s for live values ran out first (EVENT_LIVE_READ_BUDGET_S)"


def _value_of(read: _Read, answer: Answer) -> LiveValue:
    raw = answer.raw
    if answer.exception:
        return {"error": answer.exception}
    if not (isinstance(raw, dict) and raw.get("ok") is True and "value" in raw):
        return {"error": f"{read.what} answered {raw!r:.200}, not a value"}
    return {"value": raw["value"]}
