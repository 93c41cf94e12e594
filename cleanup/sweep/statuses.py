"""The owner of a run's ``cleanup_status``: made from its rows (rule 5), under a lock on the run.

Nothing else writes it. The verdicts of a batch and its runs' statuses are written in one
transaction (`cleanup.sweep.verdicts`); a status left behind anyway is repaired by a later
pass (rule 24). A person's retry (`reset_for_person`, rule 6) and a resurrection
(`reopen`, rule 14) put a run back to ``pending``.
May import: the models, conf, `cleanup.rows`, `statements`. Imported by the pass, the
runner, `manual` and `reconcile`.
"""

import datetime as dt
from collections.abc import Iterable

from django.db import transaction
from django.db.models import Case, Exists, F, OuterRef, Value, When
from django.utils import timezone

from .. import rows
from ..conf import max_revert_attempts
from ..models import TERMINAL, AlertedStatus, CleanupStatus, LogKind, Resource, Run, RunLog
from . import statements


def lock_runs(run_ids: Iterable[int]) -> dict[int, tuple[bool, str]]:
    """Lock runs for a status write, in id order; answers ``{id: (auto_cleanup, status)}``."""
    rows.taking(rows.RUNS)
    rows_ = Run.objects.select_for_update().filter(pk__in=list(run_ids)).order_by("id")
    return {pk: (auto, status) for pk, auto, status in rows_.values_list("id", "auto_cleanup", "cleanup_status")}


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
    retryable = Resource.objects.filter(rows.keeps_run_pending(max_revert_attempts()), run=OuterRef("pk"))
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


def reopen(run_ids: Iterable[int], now: dt.datetime) -> int:
    """Runs that have rows to give back again (rule 14's resurrections) are ``pending``."""
    return Run.objects.filter(pk__in=list(run_ids)).update(cleanup_status=CleanupStatus.PENDING, updated_at=now)


def reset_for_person(run: Run, actor: str | None) -> int:
    """Rule 6: a person's cleanup puts the run's unresolved rows back in the sweep
    (`rows.reset_for_person`); the run turns ``pending`` and back into the automatic sweep,
    and the retry is logged with the person. Answers how many rows were reset. Only a
    person's request calls this (`cleanup.manual`, ``cleanup_run --reset``).
    """
    now = timezone.now()
    with transaction.atomic():
        lock_runs([run.pk])
        cleared = rows.reset_for_person(run.pk, now)
        Run.objects.filter(pk=run.pk).update(cleanup_status=CleanupStatus.PENDING, auto_cleanup=True, updated_at=now)
        # Staff were told it gave up; if it gives up again after this retry, that is news.
        Run.objects.filter(pk=run.pk, alerted_status=AlertedStatus.GAVE_UP).update(alerted_status=AlertedStatus.RETRIED)
        RunLog.write(run.pk, LogKind.CLEANUP_RETRY, resources=cleared, by=actor)
    return cleared
