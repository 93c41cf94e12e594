"""The undo half: giving back, from the ledger alone, what a terminal run took.

One function gives back one run (`cleanup_run`), and the sweep leg (`sweep`) calls it
for every terminal run that still owes the world something. Work is found from the rows
themselves, never from a flag: a run whose only row is a lease is cleaned like any other.

A pass works a run's rows in groups. A lease row is a group of one, restored through its
lease; the other rows are grouped by the step that made them and given back with one
``revert`` call, keyed by the step's idempotency key. Each group is claimed first, with a
conditional UPDATE that stamps a claim token and an expiry on its rows, then the module is
called outside any transaction, then the verdict is written back only to rows that still
carry that token: a sweeper whose claim expired and was taken over changes nothing.
"""

import logging
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from . import calls, registry
from .calls import Outcome, Verdict
from .conf import claim_timeout_s, max_revert_attempts, setting
from .leases import HANDED_DOWN, give_back_lease
from .manual import reset_for_person
from .models import (
    LEASE_KIND,
    STEP_KIND,
    TERMINAL,
    UNRESOLVED,
    Attempt,
    CleanupStatus,
    Resource,
    ResourceState,
    Run,
    RunLog,
)

logger = logging.getLogger(__name__)


class CleanupRefused(Exception):
    """A cleanup that cannot be asked for, such as one of a run still in flight."""


@dataclass
class Summary:
    attempted: int = 0
    reverted: int = 0
    drifted: int = 0
    failed: int = 0
    remaining: int = 0

    def add(self, other):
        for name in ("attempted", "reverted", "drifted", "failed", "remaining"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True)
class Group:
    """Rows given back by one call: a lease row, a step's rows, or one loose row."""

    kind: str  # "lease", "step" or "row"
    key: int  # the lease row's id, the step's id, or the loose row's id
    row_ids: tuple


def plan_groups(run, now, limit=None):
    """The claimable groups of a run, at most ``limit`` of them, leases first.

    Reads ids only, so a run with a great many rows costs one narrow query here, and
    each group is fetched once it is claimed.
    """
    rows = (
        Resource.objects.filter(run=run)
        .claimable(now, max_revert_attempts())
        .order_by("id")
        .values_list("id", "kind", "step_id")
    )
    leases, by_step, loose = [], {}, []
    for row_id, kind, step_id in rows:
        if kind == LEASE_KIND:
            leases.append(Group("lease", row_id, (row_id,)))
        elif step_id is None:
            loose.append(Group("row", row_id, (row_id,)))
        else:
            by_step.setdefault(step_id, []).append(row_id)
    steps = [Group("step", step_id, tuple(ids)) for step_id, ids in by_step.items()]
    groups = leases + steps + loose
    return groups if limit is None else groups[:limit]


def past(deadline):
    """Has a leg's time budget run out? (None: no budget.)"""
    return deadline is not None and timezone.now() >= deadline


def cleanup_run(run, *, reset=False, actor=None, by=None, deadline=None):
    """Give back what one terminal run still holds; answers a `Summary`.

    ``reset`` is a person's request (the admin action, the API, ``cleanup_run --reset``):
    it puts every unresolved row of the run back under the attempt ceiling, as the only
    path that lowers a counter. The automatic sweep never sets it. Past ``deadline`` no
    further group is started; what is left waits for the next pass.
    """
    run = Run.objects.get(pk=run.pk)
    if not run.is_terminal:
        raise CleanupRefused(f"run {run.pk} is still {run.status}; only a run that has ended is cleaned")
    if reset:
        reset_for_person(run, actor)
    summary = Summary()
    now = timezone.now()
    for group in plan_groups(run, now, limit=setting("EVENT_CLEANUP_GROUPS_PER_RUN")):
        if past(deadline):
            break
        try:
            work_group(run, group, summary)
        except Exception:
            # A database error in one group must not cost the others their turn; the
            # group's claim expires and a later pass takes it again.
            logger.exception("cleanup of run %s, %s group %s failed", run.pk, group.kind, group.key)
    summary.remaining = refresh_cleanup_status(run)
    if summary.attempted:
        RunLog.write(run.pk, "cleanup.swept", **asdict(summary), by=actor or by)
    return summary


def work_group(run, group, summary):
    token = uuid.uuid4()
    now = timezone.now()
    timeout = claim_timeout_s()
    claimed = Resource.objects.claim(group.row_ids, token, now, timeout, max_revert_attempts())
    if not claimed:
        return
    rows = list(Resource.objects.held_by(token).select_related("step").order_by("id"))
    if not rows:
        return
    summary.attempted += len(rows)
    if group.kind == "lease":
        verdict, what = give_back_lease(run, rows[0], token)
    else:
        verdict, what = give_back_rows(run, rows)
    if verdict is HANDED_DOWN:
        summary.reverted += 1
    else:
        apply_verdict(run, rows, token, verdict, what, summary)


def give_back_rows(run, rows):
    """One ``revert`` call for a step's rows (or one loose row)."""
    first = rows[0]
    step = first.step
    action_id = first.action_id
    if not action_id:
        return Verdict.terminal("nothing records which action created this"), None
    action = registry.get_action(action_id)
    if action is None:
        return (
            Verdict.terminal(
                f'no module registers the action "{action_id}", so its resources cannot be given back'
            ),
            action_id,
        )
    resources = [
        {"kind": r.kind, "ref": r.ref, "payload": r.payload, "member_key": r.member_key}
        for r in rows
        if r.kind != STEP_KIND
    ]
    if not callable(getattr(action, "revert", None)):
        if not resources:
            # Only the step's placeholder, and an action that can give nothing back: there
            # is nothing a person could do about it either.
            return Verdict(Outcome.DONE), action_id
        return Verdict.terminal(f"{action_id} declares no revert(), so nothing it made can be given back"), action_id
    if step is not None:
        key = step.idempotency_key
    else:
        key = (first.payload or {}).get("idempotency_key") or first.ref
    answer = calls.call(
        action.revert,
        budget_ms=calls.budget_under_claim(action),
        what=action_id,
        run_id=run.pk,
        resources=resources,
        idempotency_key=key,
    )
    return calls.classify_revert(answer, action_id, refs=[r["ref"] for r in resources]), action_id


def apply_verdict(run, rows, token, verdict, what, summary):
    """Write one verdict on the rows still held by ``token``, and log it once.

    In one transaction: the rows and the log entry that explains them land together.
    """
    with transaction.atomic():
        _apply_verdict(run, rows, token, verdict, what, summary)


def _apply_verdict(run, rows, token, verdict, what, summary):
    now = timezone.now()
    held = Resource.objects.held_by(token)
    # Lock what is still ours: the writes below then land on exactly these rows, and the
    # attempts recorded are theirs.
    mine = set(held.select_for_update().filter(pk__in=[r.pk for r in rows]).values_list("id", flat=True))
    rows = [r for r in rows if r.pk in mine]
    release = {"claim_token": None, "claim_expires_at": None, "updated_at": now}
    ids = [r.pk for r in rows]
    if verdict.outcome == Outcome.DONE:
        failed_ids = [r.pk for r in rows if r.ref in verdict.failed and r.kind != STEP_KIND]
        done_ids = [i for i in ids if i not in failed_ids]
        written = held.filter(pk__in=done_ids).update(
            state=ResourceState.REVERTED, last_error="", resolved_at=now, **release
        )
        summary.reverted += written
        if failed_ids:
            error = f'{what} could not give back {", ".join(sorted(verdict.failed))}'
            failed_rows = [r for r in rows if r.pk in failed_ids]
            written_failed = _fail(held, failed_rows, error, now, release, retryable=True)
            summary.failed += written_failed
            written += written_failed
    elif verdict.outcome == Outcome.DRIFTED:
        written = held.filter(pk__in=ids).update(
            state=ResourceState.DRIFTED, last_error=verdict.error, **release
        )
        summary.drifted += written
    else:
        written = _fail(
            held, rows, verdict.error, now, release, retryable=verdict.outcome == Outcome.RETRY
        )
        summary.failed += written
    if not written:
        logger.warning("the verdict on %s for run %s came after its claim was taken over", what, run.pk)
        return
    _record_attempts(rows, verdict, what, now)
    detail = {
        "what": what,
        "outcome": str(verdict.outcome),
        "resources": [f"{r.kind}:{r.ref}" for r in rows],
    }
    if verdict.error:
        detail["error"] = verdict.error
    if verdict.outcome == Outcome.DONE and verdict.failed:
        detail["failed"] = sorted(verdict.failed)
    if verdict.outcome == Outcome.DRIFTED:
        detail["current"] = verdict.current
    kind = "cleanup.reverted" if verdict.outcome == Outcome.DONE and not verdict.failed else "cleanup.failed"
    RunLog.write(run.pk, kind, **detail)


def _record_attempts(rows, verdict, what, now):
    """Each row's attempt, as the row's own history (the admin's row page reads it)."""
    if verdict.outcome == Outcome.DONE:
        failed = [r for r in rows if r.ref in verdict.failed and r.kind != STEP_KIND]
        done = [r for r in rows if r not in failed]
        Attempt.record(done, "done", at=now)
        if failed:
            Attempt.record(failed, "failed", f'{what} could not give back {", ".join(sorted(verdict.failed))}', at=now)
    else:
        Attempt.record(rows, str(verdict.outcome), verdict.error, at=now)


def _fail(held, rows, error, now, release, retryable):
    """Mark rows failed; a retryable failure waits out a backoff that doubles per attempt."""
    if not retryable:
        return held.filter(pk__in=[r.pk for r in rows]).update(
            state=ResourceState.FAILED, last_error=error, retryable=False, **release
        )
    backoff = setting("EVENT_REVERT_BACKOFF_S")
    by_attempts = {}
    for r in rows:
        by_attempts.setdefault(r.revert_attempts, []).append(r.pk)
    written = 0
    for attempts, ids in by_attempts.items():
        wait = timedelta(seconds=backoff * 2 ** max(0, attempts - 1))
        written += held.filter(pk__in=ids).update(
            state=ResourceState.FAILED, last_error=error, next_attempt_at=now + wait, **release
        )
    return written


def refresh_cleanup_status(run):
    """Set a run's cleanup status from its rows; answers how many are unresolved.

    Under a lock on the run row, so that of two sweepers finishing together the one that
    writes last has also counted last.
    """
    max_attempts = max_revert_attempts()
    with transaction.atomic():
        locked = Run.objects.select_for_update().filter(pk=run.pk).first()
        if locked is None:
            return 0
        counts = Resource.objects.filter(run=run).aggregate(
            total=Count("id"),
            unresolved=Count("id", filter=Q(state__in=UNRESOLVED)),
        )
        if counts["unresolved"] == 0:
            status = CleanupStatus.COMPLETE if counts["total"] else CleanupStatus.NOT_REQUIRED
        elif locked.auto_cleanup and Resource.objects.filter(run=run).retryable(max_attempts).exists():
            status = CleanupStatus.PENDING
        else:
            status = CleanupStatus.INCOMPLETE
        if locked.cleanup_status != status:
            Run.objects.filter(pk=run.pk).update(cleanup_status=status, updated_at=timezone.now())
        run.cleanup_status = status
    return counts["unresolved"]


@dataclass
class SweepResult:
    runs: int = 0
    summary: Summary = None
    released: int = 0
    full: bool = False  # stopped at a bound: more may be waiting

    def line(self):
        s = self.summary
        return (
            f"swept {self.runs} run(s): attempted {s.attempted}, reverted {s.reverted}, "
            f"drifted {s.drifted}, failed {s.failed}, remaining {s.remaining}"
        )


def runs_needing_cleanup(now, limit):
    """Ids of terminal runs in the automatic sweep that have rows to claim now."""
    return list(
        Resource.objects.claimable(now, max_revert_attempts())
        .filter(run__status__in=TERMINAL, run__auto_cleanup=True)
        .values_list("run_id", flat=True)
        .distinct()
        .order_by("run_id")[:limit]
    )


def sweep(by="sweep", deadline=None):
    """The cleanup leg: one pass over at most ``EVENT_CLEANUP_RUN_BATCH`` runs.

    Past ``deadline`` it starts nothing new, so a task stays well inside django-q2's
    timeout however slow the shards are; the caller queues the next pass.
    """
    now = timezone.now()
    result = SweepResult(summary=Summary())
    result.released = _release_spent_claims(now)
    batch = setting("EVENT_CLEANUP_RUN_BATCH")
    run_ids = runs_needing_cleanup(now, batch)
    result.full = len(run_ids) >= batch
    for run in Run.objects.filter(pk__in=run_ids):
        if past(deadline):
            result.full = True
            break
        try:
            result.summary.add(cleanup_run(run, by=by, deadline=deadline))
            result.runs += 1
        except Exception:
            logger.exception("cleanup of run %s failed", run.pk)
    if past(deadline):
        result.full = True  # a run may have been left with groups to work
    return result


def _release_spent_claims(now):
    """Claims of dead sweepers with no attempt left become failures a person can see."""
    released = Resource.objects.release_expired_at_ceiling(now, max_revert_attempts())
    for run in Run.objects.filter(pk__in={r.run_id for r in released}):
        refresh_cleanup_status(run)
    return len(released)
