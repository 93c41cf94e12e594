"""What only a person does: ask again for a run's cleanup (rule 6), and waive rows (rule 12).

The admin, the API and the commands call these; the automatic sweep never does. Only here
(and in ``cleanup_run --reset``) are a run's attempt counters put back to zero; the engine
itself gives back only attempts that were not the row's fault (rule 6).
May import: the pass (`cleanup.sweep`), the models, `cleanup.rows`, `enqueue`, `validation`.
"""

import time
from collections.abc import Callable, Iterable

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from . import rows as ledger_rows
from . import validation
from .enqueue import queue_cleanup, queue_cleanups
from .models import STEP_KIND, UNRESOLVED, LogKind, Resource, Run, RunLog
from .sweep import CleanupRefused, cleanup_run, reset_for_person, statuses

# Passes asked for together start this far apart, so that a shard coming back from an
# outage is not hit by every run's cleanup in the same second.
RETRY_GAP_S = 0.5


def check_cleanup(run: Run) -> None:
    """Refuse, with the reason, a cleanup a person may not ask for now."""
    if not run.is_terminal:
        raise CleanupRefused(f"run {run.pk} is still {run.status}; only a run that has ended is cleaned")
    if not Resource.objects.filter(run=run, state__in=UNRESOLVED).exists():
        raise CleanupRefused(f"run {run.pk} owes nothing: every row it took is resolved, so there is nothing to clean")


def request_cleanup(run: Run, actor: str | None, reset: bool = True) -> int:
    """Rule 6, as the admin and the API ask for it: reset the run's rows, queue a pass.

    With ``reset=False`` (the API's ``{"reset": false}``) the counters are kept: only a pass
    is queued now, and the request is logged. A run still in flight, or one that owes
    nothing, is refused and nothing changes. Answers how many rows were reset.
    """
    validation.check_actor(actor)
    run = Run.objects.get(pk=run.pk)
    check_cleanup(run)
    if reset:
        cleared = reset_for_person(run, actor)
    else:
        cleared = 0
        RunLog.write(run.pk, LogKind.CLEANUP_RETRY, resources=0, by=actor, reset=False)
    queue_cleanup(run.pk, actor=actor)
    return cleared


def request_cleanups(runs: Iterable[Run], actor: str | None) -> tuple[list[tuple[Run, int]], list[str]]:
    """A person's retry of several runs: each reset now, their passes queued as one task.

    django-q2 cannot delay a task by seconds (its scheduler looks every 30 s at best), so
    the one task works the runs in turn, ``RETRY_GAP_S`` apart (see `clean_in_turn`).
    Answers ``(run, rows reset)`` for each run accepted, and the refusals.
    """
    validation.check_actor(actor)
    accepted: list[tuple[Run, int]] = []
    refused: list[str] = []
    for run in runs:
        try:
            run = Run.objects.get(pk=run.pk)
            check_cleanup(run)
        except (CleanupRefused, Run.DoesNotExist) as exc:
            refused.append(str(exc))
            continue
        accepted.append((run, reset_for_person(run, actor)))
    if len(accepted) == 1:
        queue_cleanup(accepted[0][0].pk, actor=actor)
    elif accepted:
        queue_cleanups([run.pk for run, _ in accepted], actor=actor)
    return accepted, refused


def clean_in_turn(
    run_ids: Iterable[int],
    actor: str | None,
    gap_s: float = RETRY_GAP_S,
    sleep: Callable[[float], object] | None = None,
) -> int:
    """One pass for each run, started ``gap_s`` apart, so a shard back from an outage is not
    hit by every run at once (rule 28); answers the runs passed."""
    done = 0
    for index, run in enumerate(Run.objects.filter(pk__in=run_ids).order_by("id")):
        if index:
            (sleep or time.sleep)(gap_s)
        if run.is_terminal:
            cleanup_run(run, by=actor or "queue")
            done += 1
    return done


def waive(rows: Iterable[Resource], reason: str, actor: str) -> int:
    """Rule 12: a person resolves unresolved rows by hand; answers how many were waived.

    The row keeps its last error: the reason, the person and the time are kept beside it.
    A row a sweeper holds right now is not waived: its verdict is about to land.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("a waiver needs a reason")
    problems = {
        name: validation.clean_text_problem(value) for name, value in (("reason", reason), ("actor", str(actor)))
    }
    if any(problems.values()):
        raise validation.Invalid({name: problem for name, problem in problems.items() if problem})
    now = timezone.now()
    reason = reason.strip()
    chosen = Resource.objects.filter(pk__in=[r.pk for r in rows])
    with transaction.atomic():
        # The runs first, then their rows (`rows.LOCK_ORDER`); their statuses are written
        # with the rows, as a verdict's are.
        runs = statuses.lock_runs(set(chosen.values_list("run_id", flat=True)))
        waived = ledger_rows.waive(chosen, reason, actor, now)
        # A step's placeholder stands for what the step made: once every row the step
        # recorded is resolved, it goes with them rather than wait alone for a person, or
        # for a call that would ask for the whole step back.
        steps = {r.step_id for r in waived if r.step_id is not None and r.kind != STEP_KIND}
        still_held = Resource.objects.filter(step=OuterRef("step"), state__in=UNRESOLVED).exclude(kind=STEP_KIND)
        placeholders = Resource.objects.filter(step_id__in=steps, kind=STEP_KIND).exclude(Exists(still_held))
        ledger_rows.waive(placeholders, reason, actor, now, with_its_step=True)
        statuses.write_statuses({pk: runs[pk] for pk in {r.run_id for r in waived}}, now)
    return len(waived)
