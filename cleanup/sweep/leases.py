"""Leases stacked on one target (rule 13): who restores, and who hands the baseline on.

While several runs lease one target, the value in force is the newest lease's, so only
the newest may restore; an older lease that ends hands its baseline down and resolves.
Applies do not always land in ledger order, or say that they landed, so the rules below
also read a lease's ``confirmed`` flag and the value a restore finds in place.
May import: the models, `calls`, `clock`, `registry`, `outages`, `cleanup.rows`, `statements`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import calls, clock, outages, registry, rows
from ..calls import Outcome, Verdict
from ..models import LEASE_KIND, UNRESOLVED, Attempt, AttemptOutcome, LogKind, Resource, RunLog
from . import statements

if TYPE_CHECKING:
    from .claims import Row


# What `give_back_lease` answers when the lease handed its baseline down and its row is
# already resolved.
class HandedDown:
    """The lease handed its baseline down: its row is resolved, nothing is left to write."""


HANDED_DOWN = HandedDown()


@dataclass
class LeaseOutcome:
    verdict: Verdict | HandedDown  # a Verdict to write, or HANDED_DOWN
    what: str
    running: Future[Any] | None = None  # a restore that outlived its budget and still runs
    blamed: str | None = None  # the last restore's answer blamed the backend (`cleanup.outages`)


def give_back_lease(run_id: int, row: Row, token: uuid.UUID) -> LeaseOutcome:
    """Restore one lease, or hand its baseline down to the lease that holds its target.

    Rule 13: while a newer lease on the target is unresolved, the value in force is that
    lease's, so restoring this one would undo it. The older lease instead hands its
    baseline to the next newer one and resolves; only the newest calls ``restore``, and
    the last to end puts back the value from before the first began.

    Applies do not always land in ledger order, or say that they landed: a lease is
    ``confirmed: false`` until its apply answered success, and such a lease may hold the
    target or not. It does not stop an older lease from restoring, but it receives the
    baseline all the same; and a restore that finds the value of another open lease in
    place hands down to that lease, whatever its place in the ledger.

    Every write is fenced by ``token``: a hand-down, and the baseline a restore passes
    on to newer leases, are written only while this row is still held, so a restore that
    answers after its claim was taken over changes nothing.
    """
    lease, target = registry.lease_for_ref(row.ref)
    if lease is None:
        return LeaseOutcome(Verdict.terminal(f'no module registers the lease "{row.ref}"'), row.ref)
    # An older lease of the same batch may have handed its baseline to this one since
    # the claim read the row.
    held = _held_payload(row, token)
    if held is None:
        return LeaseOutcome(Verdict.retry("the claim on this lease expired before it was restored"), row.ref)
    row.payload = held
    if "baseline" not in row.payload or "applied" not in row.payload:
        return LeaseOutcome(Verdict.terminal(f'the lease row "{row.ref}" keeps no baseline to restore'), row.ref)
    handed = hand_down(run_id, row, token, _next_confirmed)
    if handed is not None:
        return LeaseOutcome(handed, row.ref)
    return _restore(run_id, row, token, lease, target)


def _held_payload(row: Row, token: uuid.UUID) -> dict[str, Any] | None:
    payload = Resource.objects.filter(rows.held_by(token), pk=row.pk).values_list("payload", flat=True).first()
    return None if payload is None else payload if isinstance(payload, dict) else {}


def _restore(run_id: int, row: Row, token: uuid.UUID, lease: registry.Lease, target: str) -> LeaseOutcome:
    payload = row.payload
    running: list[Future[Any]] = []
    blamed: list[str | None] = []

    def restore(expected: Any) -> Verdict:
        answer = outages.call(
            lease,
            lease.restore,
            budget_ms=calls.budget_under_claim(lease),
            what=row.ref,
            backend=row.backend,
            baseline=payload["baseline"],
            expected=expected,
            run_id=run_id,
            target=target,
        )
        if answer.still_running is not None:
            running.append(answer.still_running)
        blamed.append(outages.blame(answer))
        return calls.classify_revert(answer, row.ref)

    # The attempt is spent by the call: a sweeper that dies in it has used it up.
    where, params = statements.called_rows(token, [], [row.pk])
    rows.mark_called(where, params)
    verdict = restore(payload["applied"])
    if verdict.outcome == Outcome.DRIFTED:
        # Another open lease's value is in place: it holds the target (it leased it
        # between our look and our restore, or its apply landed late).
        handed = hand_down(run_id, row, token, lambda _row, open_rows: _holder_of(open_rows, verdict.current))
        if handed is not None:
            return LeaseOutcome(handed, row.ref)
        # An unconfirmed lease that handed its baseline to this one landed after all:
        # its value is ours to put back.
        if verdict.current in payload.get("also_expected", []):
            verdict = restore(verdict.current)
        else:
            handed = hand_down(run_id, row, token, _next_newer)
            if handed is not None:
                return LeaseOutcome(handed, row.ref)
    if verdict.outcome == Outcome.DONE:
        # Before any newer lease of this batch is worked, which must read the baseline.
        _pass_baseline_if_held(row, token)
    return LeaseOutcome(verdict, row.ref, running=running[-1] if running else None, blamed=blamed[-1])


def _pass_baseline_if_held(row: Row, token: uuid.UUID) -> bool:
    """After a restore: newer open leases on the target get its baseline, but only while
    this row is still held by ``token``. A restore that answers after its claim was taken
    over hands nothing down (the newer sweeper decides for the row)."""
    with transaction.atomic():
        if not rows.lock(Resource.objects.filter(rows.held_by(token), pk=row.pk)).exists():
            return False
        _pass_baseline(row, [n for n in _open_leases(row) if n.pk > row.pk])
    return True


def _open_leases(row: Row | Resource) -> list[Resource]:
    """The other unresolved leases on ``row``'s target (on its backend), oldest first, locked."""
    return list(
        rows.lock(Resource.objects.filter(kind=LEASE_KIND, ref=row.ref, backend=row.backend, state__in=UNRESOLVED))
        .exclude(pk=row.pk)
        .order_by("id")
    )


def settle_forgotten(ref: str, backend: str, value: Any, reason: str) -> int:
    """The leases on one target that its backend forgot (``value`` is in force there now).

    Looked at oldest first: an open lease whose baseline is in force, and not its own
    applied value, no longer holds the target. It is resolved as ``orphaned`` with
    ``reason``, logged, and its baseline goes to the next newer open lease, which then
    holds the target over that baseline (rule 13): the last to end still puts back the
    value from before the first began. A lease a sweeper holds or a person must look at
    (drifted) is left alone. Answers how many leases were settled.
    """
    now = clock.now()
    settled = 0
    with transaction.atomic():
        stack = list(
            rows.lock(
                Resource.objects.filter(kind=LEASE_KIND, ref=ref, backend=backend, state__in=UNRESOLVED)
            ).order_by("id")
        )
        for index, row in enumerate(stack):
            payload = row.payload if isinstance(row.payload, dict) else {}
            if row.state not in rows.SWEPT_STATES or "baseline" not in payload:
                continue
            lease = registry.lease_for_ref(row.ref)[0]  # its value_type reads what was read back
            if not registry.same_value(lease, value, payload["baseline"]):
                continue
            if "applied" in payload and registry.same_value(lease, value, payload["applied"]):
                continue
            if rows.holds(row, rows.held_past_budget(), now):
                continue  # a restore past its budget may still land: its claim decides
            rows.orphan_lease(row, reason, now)
            heirs = [n for n in stack[index + 1 :] if n.state in UNRESOLVED][:1]
            row.payload = payload
            _pass_baseline(row, heirs)
            for heir in heirs:
                heir.payload = {**(heir.payload or {}), "baseline": payload["baseline"]}
            RunLog.write(
                row.run_id,
                LogKind.RESOURCE_ORPHANED,
                resource=f"{row.kind}:{row.ref}",
                resource_id=row.pk,
                module=row.module,
                action=row.ref.partition("#")[0],
                reason=reason,
                **({"baseline_to": heirs[0].pk} if heirs else {}),
            )
            settled += 1
    return settled


def _next_confirmed(row: Row | Resource, open_rows: Sequence[Resource]) -> Resource | None:
    heir: Resource | None = rows.heir(row, open_rows)
    return heir


def _next_newer(row: Row | Resource, open_rows: Sequence[Resource]) -> Resource | None:
    return next((n for n in open_rows if n.pk > row.pk), None)


def _holder_of(open_rows: Sequence[Resource], value: Any) -> Resource | None:
    held = [
        n
        for n in open_rows
        if isinstance(n.payload, dict)
        and "applied" in n.payload
        and registry.same_value(registry.lease_for_ref(n.ref)[0], n.payload["applied"], value)
    ]
    return held[-1] if held else None


def _pass_baseline(row: Row | Resource, heirs: Sequence[Resource]) -> None:
    """Give ``row``'s baseline to ``heirs`` (locked by the caller's transaction).

    An unconfirmed ``row`` may have put its own value in place: its heirs may restore
    over that value too (``also_expected``).
    """
    baseline = row.payload["baseline"]
    carried = list(row.payload.get("also_expected", []))
    if not rows.lease_confirmed(row):
        carried.append(row.payload["applied"])
    for heir in heirs:
        payload = dict(heir.payload or {})
        payload["baseline"] = baseline
        if carried:
            payload["also_expected"] = [*payload.get("also_expected", []), *carried]
        Resource.objects.filter(pk=heir.pk).update(payload=payload, updated_at=clock.at())


def hand_down(
    run_id: int, row: Row, token: uuid.UUID, choose: Callable[[Row, Sequence[Resource]], Resource | None]
) -> Verdict | HandedDown | None:
    """Give this lease's baseline to the lease ``choose`` picks among the open ones.

    ``choose(row, open_rows)`` answers the heir or None. The leases between this row and
    a newer heir (unconfirmed ones, passed over) receive the baseline too.
    Answers None when there is no heir (this one must restore), `HANDED_DOWN` once this
    row is resolved, or a verdict to write when the hand-down must wait.
    """
    with transaction.atomic():
        open_rows = _open_leases(row)
        heir = choose(row, open_rows)
        if heir is None:
            return None
        # A newer lease held by another sweeper is being restored; one claimed by this
        # same batch waits for its turn in this pass and reads the baseline then.
        if rows.holds(heir, rows.claimed_by_another(token), clock.now()):
            return Verdict.retry(f"a newer lease on this target (row {heir.pk}) is being restored; try again after it")
        _pass_baseline(row, [n for n in open_rows if row.pk < n.pk < heir.pk] + [heir])
        if not rows.hand_down(token, row.pk):
            # Our claim was taken over: leave the other rows as they were.
            transaction.set_rollback(True)
            return Verdict.retry("the claim on this lease expired before it could be handed down")
        Attempt.record([row], AttemptOutcome.DONE, f"handed its baseline down to row {heir.pk}")
        RunLog.write(
            run_id,
            LogKind.CLEANUP_REVERTED,
            what=row.ref,
            outcome="handed_down",
            resources=[f"{row.kind}:{row.ref}"],
            baseline=row.payload["baseline"],
            to_resource=heir.pk,
            to_run=heir.run_id,
        )
    return HANDED_DOWN
