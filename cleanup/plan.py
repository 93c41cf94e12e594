"""A run's cleanup plan: what the next pass would do, read without doing any of it (rule 12).

The plan tells apart the work the next pass will do from the rows waiting for a person
(no attempt left, not retryable, drifted), and says for each lease what will happen to
its target: restored, its baseline handed down to a newer lease (rule 13), or left
alone because someone else's value is in place. On request it reads the live value of
each leased target through the lease's ``read``, under the lease's budget.
May import: the models, conf, `calls`, `registry`. Reads only.
"""

from django.db.models import Q

from . import calls, registry
from .conf import max_revert_attempts
from .models import LEASE_KIND, UNRESOLVED, Resource, ResourceState

# What the next pass does with a group.
RESTORE = "restore"
HAND_DOWN = "hand down"
REVERT = "revert"
LEAVE = "leave (drifted)"
WAITING = "waiting for a person"
IN_HAND = "being given back now"


def cleanup_plan(run, *, live=False, max_rows=None):
    """What a pass would do for a run now, group by group (rule 12). Reads only.

    ``max_rows`` caps how many unresolved rows are read (the oldest first), so a run with
    a great many rows is planned in bounded time; ``live`` also reads each lease's target.
    """
    max_attempts = max_revert_attempts()
    rows = Resource.objects.filter(run=run, state__in=UNRESOLVED).select_related("step").order_by("id")
    if max_rows is not None:
        rows = rows[:max_rows]
    rows = list(rows)
    newer = _newer_leases(run, [r for r in rows if r.kind == LEASE_KIND])
    plan = []
    for group in _groups(rows):
        verb, problem = _verb(group[0])
        entries = [_row(r, max_attempts, newer, live) for r in group]
        plan.append({"verb": verb, "problem": problem, "next": _next(group[0], entries, verb, newer), "rows": entries})
    return plan


# A group's key in the plan's order: leases first, then a step's rows, then loose rows.
LEASE_GROUP, STEP_GROUP, LOOSE_GROUP = 0, 1, 2


def group_keys(run):
    """Every group of the run's unresolved rows, as ``(rank, id)`` in the plan's order.

    A lease is its row's id; a step's rows, the step's id; a loose row, its own id. Reads
    ids only, so a console can page through a plan of any size (`plan_of_groups`).
    """
    rows = Resource.objects.filter(run=run, state__in=UNRESOLVED).values_list("id", "kind", "step_id")
    keys = set()
    for pk, kind, step_id in rows:
        if kind == LEASE_KIND:
            keys.add((LEASE_GROUP, pk))
        elif step_id is not None:
            keys.add((STEP_GROUP, step_id))
        else:
            keys.add((LOOSE_GROUP, pk))
    return sorted(keys)


def plan_of_groups(run, keys, *, live=False):
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
    by_key = {}
    for row in rows:
        if row.kind == LEASE_KIND or row.step_id is None:
            key = (LEASE_GROUP if row.kind == LEASE_KIND else LOOSE_GROUP, row.pk)
        else:
            key = (STEP_GROUP, row.step_id)
        by_key.setdefault(key, []).append(row)
    newer = _newer_leases(run, [r for r in rows if r.kind == LEASE_KIND])
    plan = []
    for key in keys:
        group = by_key.get(tuple(key))
        if not group:
            continue  # resolved since the keys were read
        verb, problem = _verb(group[0])
        entries = [_row(r, max_attempts, newer, live) for r in group]
        plan.append({"verb": verb, "problem": problem, "next": _next(group[0], entries, verb, newer), "rows": entries})
    return plan


def _groups(rows):
    """Leases first, one group each; then a step's rows together; then loose rows."""
    leases, by_step, loose = [], {}, []
    for row in rows:
        if row.kind == LEASE_KIND:
            leases.append([row])
        elif row.step_id is None:
            loose.append([row])
        else:
            by_step.setdefault(row.step_id, []).append(row)
    return leases + list(by_step.values()) + loose


def _verb(first):
    if first.kind == LEASE_KIND:
        lease, _ = registry.lease_for_ref(first.ref)
        if lease is None:
            return None, f'no module registers the lease "{first.ref}"'
        return f"{lease.id}.restore", None
    action = registry.get_action(first.action_id) if first.action_id else None
    if action is not None and callable(getattr(action, "revert", None)):
        return f"{first.action_id}.revert", None
    return None, f'no module can give back what "{first.action_id}" made'


def _next(first, entries, verb, newer):
    """What the next pass does with this group; a group with no attempt left waits for a person."""
    if first.state == ResourceState.DRIFTED:
        return LEAVE
    if first.state == ResourceState.REVERTING:
        return IN_HAND
    if verb is None or not any(e["attempts_left"] for e in entries):
        return WAITING
    if first.kind == LEASE_KIND:
        return HAND_DOWN if first.pk in newer else RESTORE
    return REVERT


def _newer_leases(run, lease_rows):
    """For each lease row, the newer unresolved lease of another run it would hand down to (rule 13).

    As `cleanup.sweep.leases` chooses: the next newer lease whose apply was confirmed.
    """
    if not lease_rows:
        return {}
    others = [
        (pk, ref, backend, run_id)
        for pk, ref, backend, run_id, payload in Resource.objects.filter(
            kind=LEASE_KIND, ref__in={r.ref for r in lease_rows}, state__in=UNRESOLVED
        )
        .exclude(run=run)
        .order_by("id")
        .values_list("id", "ref", "backend", "run_id", "payload")
        if not (isinstance(payload, dict) and payload.get("confirmed") is False)
    ]
    heirs = {}
    for row in lease_rows:
        heir = next(
            (
                (pk, run_id)
                for pk, ref, backend, run_id in others
                if (ref, backend) == (row.ref, row.backend) and pk > row.pk
            ),
            None,
        )
        if heir is not None:
            heirs[row.pk] = {"resource": heir[0], "run": heir[1]}
    return heirs


def _row(r, max_attempts, newer, live):
    entry = {
        "id": r.pk,
        "kind": r.kind,
        "ref": r.ref,
        "state": r.state,
        "attempts": r.revert_attempts,
        "attempts_left": _attempts_left(r, max_attempts),
        "last_error": r.last_error,
    }
    if r.kind == LEASE_KIND:
        payload = r.payload if isinstance(r.payload, dict) else {}
        entry["lease"] = {
            "baseline": payload.get("baseline"),
            "applied": payload.get("applied"),
            "hand_down_to": newer.get(r.pk),
        }
        if live:
            entry["lease"]["live"] = read_live(r.ref, r.backend)
    return entry


def read_live(ref, backend=""):
    """The value in force on a lease's target now, read through the lease under its budget.

    Answers ``{"value": v}`` or ``{"error": text}``; an answer that is not exactly a
    success with a value is an error, never a value.
    """
    lease, target = registry.lease_for_ref(ref)
    if lease is None:
        return {"error": f'no module registers the lease "{ref}"'}
    what = f"{lease.id}.read"
    answer = calls.call(lease.read, budget_ms=calls.budget_of(lease), what=what, backend=backend, target=target)
    raw = answer.raw
    if answer.exception:
        return {"error": answer.exception}
    if not (isinstance(raw, dict) and raw.get("ok") is True and "value" in raw):
        return {"error": f"{lease.id}.read answered {raw!r:.200}, not a value"}
    return {"value": raw["value"]}


def _attempts_left(row, max_attempts):
    if not row.retryable or row.state not in (ResourceState.LIVE, ResourceState.FAILED):
        return 0
    return max(0, max_attempts - row.revert_attempts)
