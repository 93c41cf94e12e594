"""A run's cleanup status, made from its rows (rule 5), under a lock on the run.

The verdicts of a batch and its runs' statuses are written in one transaction
(`cleanup.sweep.verdicts`); a status left behind anyway is repaired by a later pass.
May import: the models, conf, `statements`. Imported by the pass, the runner and `manual`.
"""

from django.db import transaction
from django.db.models import Case, Exists, F, OuterRef, Value, When
from django.utils import timezone

from ..conf import max_revert_attempts
from ..models import TERMINAL, CleanupStatus, Resource, Run
from . import statements


def lock_runs(run_ids):
    """Lock runs for a status write, in id order; answers ``{id: (auto_cleanup, status)}``."""
    rows = Run.objects.select_for_update().filter(pk__in=run_ids).order_by("id")
    return {pk: (auto, status) for pk, auto, status in rows.values_list("id", "auto_cleanup", "cleanup_status")}


def write_statuses(runs, now):
    """Set each locked run's cleanup status from its rows; answers ``{id: (status, unresolved)}``."""
    counted = _counts(list(runs))
    answer, changed = {}, {}
    for run_id, (auto_cleanup, current) in runs.items():
        counts = counted.get(run_id, {"total": 0, "unresolved": 0, "retryable": 0})
        status = _status(counts, auto_cleanup)
        if status != current:
            changed.setdefault(status, []).append(run_id)
        answer[run_id] = (status, counts["unresolved"])
    if changed:
        whens = [When(pk__in=ids, then=Value(status.value)) for status, ids in changed.items()]
        Run.objects.filter(pk__in=[i for ids in changed.values() for i in ids]).update(
            cleanup_status=Case(*whens, default=F("cleanup_status")), updated_at=now
        )
    return answer


def _counts(run_ids):
    """Rows, unresolved rows and rows the sweep will still try, per run: one query."""
    return statements.status_counts(run_ids, max_revert_attempts())


def _status(counts, auto_cleanup):
    """Rule 5: complete when nothing is unresolved, pending while anything is retryable."""
    if counts["unresolved"] == 0:
        return CleanupStatus.COMPLETE if counts["total"] else CleanupStatus.NOT_REQUIRED
    if auto_cleanup and counts["retryable"]:
        return CleanupStatus.PENDING
    return CleanupStatus.INCOMPLETE


def refresh_statuses(run_ids):
    """Make the cleanup status of ``run_ids`` say what their rows say, under their locks."""
    with transaction.atomic():
        return write_statuses(lock_runs(run_ids), timezone.now())


def repair_statuses(limit):
    """Terminal runs left ``pending`` with nothing the sweep will still try get their true status.

    A verdict and its run's status are written together, but a status can still be left
    behind (by an older version, or a write that died between them); the next pass
    repairs it here. Answers how many runs were looked at.
    """
    retryable = Resource.objects.filter(run=OuterRef("pk")).retryable(max_revert_attempts())
    stale = list(
        Run.objects.filter(status__in=TERMINAL, cleanup_status=CleanupStatus.PENDING)
        .exclude(Exists(retryable))
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    if stale:
        refresh_statuses(stale)
    return len(stale)


def refresh_cleanup_status(run):
    """Set a run's cleanup status from its rows; answers how many are unresolved.

    Under a lock on the run row, so that of two writers finishing together the one that
    writes last has also counted last.
    """
    status, unresolved = refresh_statuses([run.pk]).get(run.pk, (run.cleanup_status, 0))
    run.cleanup_status = status
    return unresolved
