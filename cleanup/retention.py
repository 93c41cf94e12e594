"""Retention: what ended long ago is deleted, in bounded batches, so the ledger stays the
size of its retention window.

A run is prunable when it ended more than ``EVENT_RETENTION_DAYS`` ago, its cleanup is
complete or was never needed, nothing of it is unresolved, and staff have been told
everything about it (no unsent alert, no transition still to tell). A run with any
unresolved row, or one a person asked to clean up (its cleanup is ``pending`` again), is
never pruned. Each batch is one short transaction of at most ``EVENT_PRUNE_BATCH`` runs:
the runs are locked with SKIP LOCKED (a run some other worker holds is left for the next
batch), checked again under the lock, written to the archive when there is one, and
deleted with everything they own, table by table, in a fixed number of statements.

The modules' log and the sent alerts outside the window are deleted the same way; the
tasks' results are bounded by django-q2 itself (``save_limit`` in the site's settings).
May import: conf, the models, `clock` and `rows` (a row's history).
"""

import datetime as dt
import gzip
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Exists, Model, OuterRef, QuerySet
from django.forms.models import model_to_dict

from . import clock, rows
from .conf import setting
from .models import (
    TERMINAL,
    UNRESOLVED,
    Alert,
    AlertedStatus,
    Attempt,
    CleanupStatus,
    LogKind,
    ModuleEvent,
    Resource,
    Run,
    RunLog,
    Step,
)

M = TypeVar("M", bound=Model)
# What a run owns and its archive line holds.
OfRun = Step | Resource | Attempt | RunLog | Alert

# Cleanup states a run may be pruned in: nothing left to give back.
SETTLED = (CleanupStatus.COMPLETE, CleanupStatus.NOT_REQUIRED)
# Staff were told the cleanup gave up: its recovery is still to tell.
TOLD_GAVE_UP = (AlertedStatus.GAVE_UP, AlertedStatus.RETRIED)


@dataclass
class PruneResult:
    runs: int = 0
    steps: int = 0
    resources: int = 0
    attempts: int = 0
    log: int = 0
    alerts: int = 0
    module_events: int = 0
    batches: int = 0
    dry_run: bool = False
    run_ids: list[int] = field(default_factory=list)

    def line(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"{verb} {self.runs} run(s) with {self.steps} step(s), {self.resources} ledger row(s), "
            f"{self.attempts} attempt(s), {self.log} log entr(ies) and {self.alerts} alert(s); "
            f"{self.module_events} module log entr(ies); {self.batches} batch(es)"
        )


def cutoff_for(days: int, now: dt.datetime | None = None) -> dt.datetime | None:
    """The moment before which a run's end is old enough, or None when ``days`` keeps everything."""
    if not days:
        return None
    return (now or clock.now()) - timedelta(days=days)


def prunable_runs(cutoff: dt.datetime) -> QuerySet[Run]:
    """The runs that may be deleted now: ended before ``cutoff``, settled, and told."""
    owing = Resource.objects.filter(run=OuterRef("pk"), state__in=UNRESOLVED)
    unsent = Alert.objects.filter(run=OuterRef("pk"), sent_at__isnull=True)
    return (
        Run.objects.filter(status__in=TERMINAL, ended_at__lt=cutoff, cleanup_status__in=SETTLED)
        # A recovery staff have not yet been told of.
        .exclude(cleanup_status=CleanupStatus.COMPLETE, alerted_status__in=TOLD_GAVE_UP)
        .filter(~Exists(owing), ~Exists(unsent))
    )


def prune(
    days: int | None = None,
    batch: int | None = None,
    dry_run: bool = False,
    archive: "Archive | None" = None,
    now: dt.datetime | None = None,
    max_batches: int | None = None,
) -> PruneResult:
    """Delete what is past the retention window; answer what was (or would be) deleted.

    ``days`` defaults to ``EVENT_RETENTION_DAYS`` (0 keeps everything); ``archive`` is an
    open `Archive` that receives every run before it is deleted. ``max_batches`` bounds
    one call (the scheduled task's), None goes on until nothing is left.
    """
    days = setting("EVENT_RETENTION_DAYS") if days is None else days
    batch = batch or setting("EVENT_PRUNE_BATCH")
    result = PruneResult(dry_run=dry_run)
    cutoff = cutoff_for(days, now)
    if cutoff is None:
        return result
    if dry_run:
        ids = list(prunable_runs(cutoff).values_list("pk", flat=True))
        result.run_ids = ids
        result.runs = len(ids)
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            result.steps += Step.objects.filter(run_id__in=chunk).count()
            result.resources += Resource.objects.filter(run_id__in=chunk).count()
            result.attempts += Attempt.objects.filter(run_id__in=chunk).count()
            result.log += RunLog.objects.filter(run_id__in=chunk).count()
            result.alerts += Alert.objects.filter(run_id__in=chunk).count()
        result.batches = -(-len(ids) // batch)
        result.module_events = _old_module_events(cutoff).count()
        return result
    after = 0
    while max_batches is None or result.batches < max_batches:
        deleted = _prune_batch(cutoff, batch, after, archive, result)
        if deleted is None:
            break
        after = deleted
        result.batches += 1
    result.module_events = _delete_in_batches(_old_module_events(cutoff), batch)
    result.alerts += _delete_in_batches(Alert.objects.filter(run__isnull=True, sent_at__lt=cutoff), batch)
    return result


def _old_module_events(cutoff: dt.datetime) -> QuerySet[ModuleEvent]:
    # A change staff were never told of stays until it is told (cleanup.alerts).
    return ModuleEvent.objects.filter(at__lt=cutoff, alerted_at__isnull=False)


def _delete_in_batches(queryset: QuerySet[M], batch: int) -> int:
    total = 0
    while True:
        with transaction.atomic():
            ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:batch])
            if not ids:
                return total
            count, _ = queryset.model._default_manager.filter(pk__in=ids).delete()
        total += count


def _prune_batch(
    cutoff: dt.datetime, batch: int, after: int, archive: "Archive | None", result: PruneResult
) -> int | None:
    """One transaction: lock up to ``batch`` prunable runs past ``after``, archive, delete.

    Answers the highest run id looked at, or None when there was nothing left.
    """
    with transaction.atomic():
        candidates = prunable_runs(cutoff).filter(pk__gt=after).order_by("pk")
        if connection.features.has_select_for_update_skip_locked:
            candidates = candidates.select_for_update(skip_locked=True, of=("self",))
        runs = list(candidates[:batch])
        if not runs:
            return None
        ids = [run.pk for run in runs]
        mark = archive.write_runs(runs) if archive is not None else None
        try:
            # Children first, so that no delete has to look for what still points at it.
            # A row of another run that records one of these again (rule 14) keeps its
            # own history and forgets the link.
            Resource.objects.filter(resurrected_from__run_id__in=ids).exclude(run_id__in=ids).update(
                resurrected_from=None
            )
            result.attempts += _delete_of_runs(Attempt, ids)
            result.resources += _delete_of_runs(Resource, ids)
            result.log += _delete_of_runs(RunLog, ids)
            result.steps += _delete_of_runs(Step, ids)
            result.alerts += _delete_of_runs(Alert, ids)
            result.runs += _delete_of_runs(Run, ids, column="id")
        except BaseException:
            if archive is not None and mark is not None:
                archive.cut(mark)
            raise
        result.run_ids.extend(ids)
        return ids[-1]


def _delete_of_runs(model: type[Model], ids: Sequence[int], column: str = "run_id") -> int:
    """One DELETE of every row of ``model`` that belongs to the runs ``ids``: no row is read.

    Django's own delete reads every row first to follow its relations; the order of the
    calls in `_prune_batch` leaves nothing pointing at these rows, so one statement does.
    """
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {column} = ANY(%s)", [list(ids)])
        count: int = cursor.rowcount
        return count


class Archive:
    """What prune deletes, one JSON object per run and line, written before the delete.

    gzip when the file name ends in ``.gz``. A batch whose delete fails is cut off the file
    again, so the archive holds exactly what was deleted.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.gzip = self.path.endswith(".gz")
        self._file = open(self.path, "ab")  # noqa: SIM115 (closed by close())

    def cut(self, mark: int) -> None:
        """Take back what was written since ``mark`` (a batch whose delete failed)."""
        self._file.truncate(mark)
        self._file.seek(mark)

    def write_runs(self, runs: Sequence[Run]) -> int:
        ids = [run.pk for run in runs]
        steps = _grouped(Step.objects.filter(run_id__in=ids).order_by("run_id", "position"))
        ledger = list(Resource.objects.filter(run_id__in=ids).order_by("pk"))
        resources = _grouped(ledger)
        stored = list(Attempt.objects.filter(run_id__in=ids).order_by("pk"))
        logs = list(RunLog.objects.filter(run_id__in=ids).order_by("pk"))
        attempts = _attempts(ledger, stored, logs)
        log = _grouped(logs)
        alerts = _grouped(Alert.objects.filter(run_id__in=ids).order_by("pk"))
        lines = []
        for run in runs:
            record = {
                "run": _fields(run),
                "steps": steps.get(run.pk, []),
                "resources": resources.get(run.pk, []),
                "attempts": attempts.get(run.pk, []),
                "log": log.get(run.pk, []),
                "alerts": alerts.get(run.pk, []),
            }
            lines.append(json.dumps(record, cls=DjangoJSONEncoder, sort_keys=True) + "\n")
        data = "".join(lines).encode()
        # Each batch is a gzip member of its own: concatenated members are one gzip
        # file to every reader, and a batch can be cut off again whole.
        if self.gzip:
            data = gzip.compress(data)
        mark = self._file.tell()
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        return mark

    def close(self) -> None:
        self._file.close()


def _fields(instance: Model) -> dict[str, Any]:
    data = model_to_dict(instance, fields=[f.name for f in instance._meta.concrete_fields])
    data["id"] = instance.pk
    return data


def _attempts(
    resources: Sequence[Resource], stored: Sequence[Attempt], logs: Sequence[RunLog]
) -> dict[int | None, list[dict[str, Any]]]:
    """The runs' attempts as staff read them (`rows.history`): those recorded, and for each
    row given back the attempt that did it, which the row itself records; per run, oldest first."""
    by_row: dict[int | None, list[Attempt]] = {}
    swept: dict[int | None, list[RunLog]] = {}
    for attempt in stored:
        by_row.setdefault(attempt.resource_id, []).append(attempt)
    for entry in logs:
        if entry.kind == LogKind.CLEANUP_SWEPT:
            swept.setdefault(entry.run_id, []).append(entry)
    made: list[Attempt] = []
    for row in resources:
        recorded = by_row.pop(row.pk, [])
        made += rows.history(row, recorded[::-1], swept.get(row.run_id, []))
    # Attempts of rows no longer in the ledger (none while the ledger keeps its rows with their runs).
    made += [a for recorded in by_row.values() for a in recorded]
    made.sort(key=lambda a: (a.at, a.pk is None, a.pk or 0))
    out: dict[int | None, list[dict[str, Any]]] = {}
    for attempt in made:
        out.setdefault(attempt.run_id, []).append(_fields(attempt))
    return out


def _grouped(queryset: Iterable[OfRun]) -> dict[int | None, list[dict[str, Any]]]:
    out: dict[int | None, list[dict[str, Any]]] = {}
    for item in queryset:
        out.setdefault(item.run_id, []).append(_fields(item))
    return out
