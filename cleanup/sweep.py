"""The undo half: giving back, from the ledger alone, what a terminal run took.

A pass works in batches. It takes a batch of terminal runs that still owe the world
something (`cleanup.work`), claims the first groups of each in one conditional UPDATE
that stamps a claim token and an expiry, makes the module calls concurrently outside
any transaction (`cleanup.calling`), then writes every verdict of the batch, its log
entries and the runs' cleanup statuses in one transaction, only on rows that still carry
the token (`cleanup.verdicts`): a sweeper whose claim expired and was taken over
changes nothing. Work is found from the rows themselves, never from a flag: a run whose
only row is a lease is cleaned like any other.
"""

import logging
import uuid
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from . import calling, registry, verdicts, work
from .calling import past
from .conf import max_revert_attempts, setting
from .models import (
    LEASE_KIND,
    UNRESOLVED,
    CleanupStatus,
    Resource,
    ResourceState,
    Run,
    RunLog,
)
from .verdicts import Summary
from .work import runs_needing_cleanup

logger = logging.getLogger(__name__)


class CleanupRefused(Exception):
    """A cleanup that cannot be asked for, such as one of a run still in flight."""


def cleanup_run(run, *, reset=False, actor=None, by=None, deadline=None):
    """Give back what one terminal run still holds; answers a `Summary`.

    ``reset`` is a person's request (the admin action, the API, ``cleanup_run --reset``):
    it puts every unresolved row of the run back under the attempt ceiling, as the only
    path that lowers a counter. The automatic sweep never sets it. Past ``deadline`` no
    further group is started; what is left waits for the next pass. ``summary.more``
    says that the pass stopped at a bound with groups left to work.
    """
    run = Run.objects.get(pk=run.pk)
    if not run.is_terminal:
        raise CleanupRefused(f"run {run.pk} is still {run.status}; only a run that has ended is cleaned")
    if reset:
        reset_for_person(run, actor)
    summaries, more = run_batch([run.pk], by=actor or by, deadline=deadline, skip_locked=False)
    summary = summaries.get(run.pk)
    if summary is None:
        summary = Summary(remaining=refresh_cleanup_status(run))
    summary.more = more
    return summary


def run_batch(run_ids, *, by, deadline=None, skip_locked=True):
    """One batch of a pass: claim, call, write. Answers ``({run id: Summary}, more)``.

    ``more`` is true when the batch stopped at a bound (groups per run, or the time
    budget) with work left behind.
    """
    batch = work.claim(run_ids, uuid.uuid4(), skip_locked=skip_locked)
    if not batch.groups:
        return {}, batch.more
    summaries, called = {}, []
    for group in batch.leases():
        # Rule 13: each lease's verdict is written before the next lease on its target
        # is worked.
        called.append(calling.call_lease(group, batch.token, deadline))
        _write(verdicts.write_now, batch.token, called[-1:], summaries, by)
    rest = calling.call_groups(batch.others(), deadline)
    _write(verdicts.write, batch, rest, by, summaries)
    called += rest
    calling.hold_overdue(batch.token, called)
    return summaries, batch.more or any(c.verdict is None and not c.handed_down for c in called)


def _write(writer, *args):
    """Write verdicts, once more on a fresh connection if the first attempt lost it.

    The write is fenced by the claim, so writing it twice changes nothing; without a
    verdict the rows would wait for their claim to expire and spend another attempt.
    """
    try:
        return writer(*args)
    except DatabaseError:
        logger.exception("writing verdicts failed; trying once more")
        connection.close()
        return writer(*args)


def reset_for_person(run, actor):
    """Rule 6: a person's cleanup puts the run's unresolved rows back in the sweep."""
    now = timezone.now()
    rows = Resource.objects.filter(run=run).filter(
        Q(state__in=(ResourceState.LIVE, ResourceState.FAILED, ResourceState.DRIFTED))
        | Q(state=ResourceState.REVERTING, claim_expires_at__lt=now)
    )
    with transaction.atomic():
        ids = list(rows.values_list("id", flat=True))
        Resource.objects.filter(pk__in=ids, state=ResourceState.DRIFTED).update(
            state=ResourceState.LIVE
        )
        cleared = rows.filter(pk__in=ids).update(
            revert_attempts=0, retryable=True, next_attempt_at=None, updated_at=now
        )
        Run.objects.filter(pk=run.pk).update(
            cleanup_status=CleanupStatus.PENDING, auto_cleanup=True, updated_at=now
        )
        RunLog.write(run.pk, "cleanup.retry", resources=cleared, by=actor)
    return cleared


def refresh_cleanup_status(run):
    """Set a run's cleanup status from its rows; answers how many are unresolved.

    Under a lock on the run row, so that of two writers finishing together the one that
    writes last has also counted last.
    """
    status, unresolved = verdicts.refresh_statuses([run.pk]).get(run.pk, (run.cleanup_status, 0))
    run.cleanup_status = status
    return unresolved


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


def sweep(by="sweep", deadline=None):
    """The cleanup leg: one pass over at most ``EVENT_CLEANUP_RUN_BATCH`` runs.

    Past ``deadline`` it starts nothing new, so a task stays well inside django-q2's
    timeout however slow the shards are. ``full`` says the pass stopped at a bound (runs
    per batch, groups per run, the time budget) with work left: the caller queues the
    next pass at once, and the schedule is only the backstop.
    """
    now = timezone.now()
    result = SweepResult(summary=Summary())
    result.released = verdicts.release_spent_claims(now, by)
    batch = setting("EVENT_CLEANUP_RUN_BATCH")
    verdicts.repair_statuses(batch)
    run_ids = runs_needing_cleanup(now, batch)
    result.full = len(run_ids) >= batch
    if run_ids and not past(deadline):
        try:
            summaries, more = run_batch(run_ids, by=by, deadline=deadline)
        except Exception:
            # The claims of a batch that failed expire and are taken again by a later pass.
            logger.exception("cleanup of runs %s failed", run_ids)
            summaries, more = {}, True
        for summary in summaries.values():
            result.summary.add(summary)
        result.runs = len(summaries)
        result.full = result.full or more
    if past(deadline):
        result.full = True  # a run may have been left with groups to work
    return result


def cleanup_plan(run):
    """What a pass would do for a run now, group by group, without doing any of it (rule 12)."""
    max_attempts = max_revert_attempts()
    rows = {
        r.pk: r
        for r in Resource.objects.filter(run=run, state__in=UNRESOLVED).select_related("step")
    }
    leases, by_step, loose = [], {}, []
    for row in sorted(rows.values(), key=lambda r: r.pk):
        if row.kind == LEASE_KIND:
            leases.append([row])
        elif row.step_id is None:
            loose.append([row])
        else:
            by_step.setdefault(row.step_id, []).append(row)
    plan = []
    for group in leases + list(by_step.values()) + loose:
        first = group[0]
        if first.kind == LEASE_KIND:
            lease, _ = registry.lease_for_ref(first.ref)
            verb = f"{lease.id}.restore" if lease else None
            problem = None if lease else f'no module registers the lease "{first.ref}"'
        else:
            action = registry.get_action(first.action_id) if first.action_id else None
            has_revert = action is not None and callable(getattr(action, "revert", None))
            verb = f"{first.action_id}.revert" if has_revert else None
            problem = None if has_revert else f'no module can give back what "{first.action_id}" made'
        plan.append(
            {
                "verb": verb,
                "problem": problem,
                "rows": [
                    {
                        "id": r.pk,
                        "kind": r.kind,
                        "ref": r.ref,
                        "state": r.state,
                        "attempts": r.revert_attempts,
                        "attempts_left": _attempts_left(r, max_attempts),
                        "last_error": r.last_error,
                    }
                    for r in group
                ],
            }
        )
    return plan


def _attempts_left(row, max_attempts):
    if not row.retryable or row.state not in (ResourceState.LIVE, ResourceState.FAILED):
        return 0
    return max(0, max_attempts - row.revert_attempts)


def request_cleanup(run, actor):
    """Rule 6, as the admin and the API ask for it: reset the run's rows, queue a pass."""
    from .tasks import queue_cleanup

    run = Run.objects.get(pk=run.pk)
    if not run.is_terminal:
        raise CleanupRefused(f"run {run.pk} is still {run.status}; only a run that has ended is cleaned")
    cleared = reset_for_person(run, actor)
    queue_cleanup(run.pk, actor=actor)
    return cleared


def waive(rows, reason, actor):
    """Rule 12: a person resolves unresolved rows by hand; answers how many were waived.

    A row a sweeper holds right now is not waived: its verdict is about to land.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("a waiver needs a reason")
    now = timezone.now()
    waivable = Q(state__in=(ResourceState.LIVE, ResourceState.FAILED, ResourceState.DRIFTED)) | Q(
        state=ResourceState.REVERTING, claim_expires_at__lt=now
    )
    reason = reason.strip()
    waived = Resource.objects.filter(pk__in=[r.pk for r in rows]).resolve_logged(
        waivable, ResourceState.WAIVED, f"waived by {actor}: {reason}", "resource.waived", reason=reason, by=actor
    )
    for run in Run.objects.filter(pk__in={r.run_id for r in waived}):
        refresh_cleanup_status(run)
    return len(waived)
