"""The pass: giving back, from the ledger alone, what a terminal run took (the undo half).

One pass works in batches, each in four stages, one module apiece: find the terminal
runs that still owe something and claim their first groups in one conditional UPDATE
(`claims`); make the module calls concurrently, outside any transaction (`dispatch`,
with `leases` for rule 13); write every verdict of the batch with its log and attempts,
only on rows that still carry the claim's token (`verdicts`), and the runs' cleanup
statuses in the same transaction (`statuses`). `statements` is the SQL the stages send,
compiled from the row owner's predicates (`cleanup.rows`), whose transitions every stage
calls. Work is found from the rows, never from a flag (rule 2).

This module is the pass's public face: `sweep`, `cleanup_run`, `run_batch`, `Ahead`,
`CleanupRefused`, `SweepResult`, `refresh_cleanup_status`, `runs_needing_cleanup`, `past`.
May import: its own stages, `outages`, `counters`, the models and conf; never a surface, `manual` or
`runner` (they import it).
"""

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import DatabaseError, connection
from django.utils import timezone

from .. import clock, counters, outages
from ..conf import setting
from ..models import Run
from . import claims, dispatch, reconnect, statuses, verdicts
from .claims import runs_needing_cleanup
from .dispatch import past
from .statuses import refresh_cleanup_status, reset_for_person
from .verdicts import Summary

__all__ = [
    "Ahead",
    "CleanupRefused",
    "SweepResult",
    "cleanup_run",
    "past",
    "refresh_cleanup_status",
    "reset_for_person",
    "run_batch",
    "runs_needing_cleanup",
    "sweep",
]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


# How often a pass looks for work again when other sweepers were claiming all it found.
LOOKS = 3
LOOK_AGAIN_S = 0.05


class CleanupRefused(Exception):
    """A cleanup that cannot be asked for, such as one of a run still in flight."""


class Ahead:
    """Queues the next pass, at most once, as soon as a pass knows it leaves work behind.

    A pass that claimed only part of what waits calls it right after its claim, before its
    module calls: another worker claims the next groups meanwhile, instead of the work
    waiting for this pass to end and for the queue to hand the next one out (rule 25).
    """

    def __init__(self, queue: Callable[[], object]) -> None:
        self._queue = queue
        self.queued = False

    def __call__(self) -> None:
        if not self.queued:
            self.queued = True
            self._queue()


def cleanup_run(
    run: Run,
    *,
    reset: bool = False,
    actor: str | None = None,
    by: str | None = None,
    deadline: dt.datetime | None = None,
    ahead: Ahead | None = None,
) -> Summary:
    """Give back what one terminal run still holds; answers a `Summary`.

    ``reset`` is a person's request (``cleanup_run --reset``, rule 6): it puts every
    unresolved row of the run back under the attempt ceiling, with its counter at zero
    (`statuses.reset_for_person`). The automatic sweep never sets it. Past ``deadline`` no
    further group is started; what is left waits for the next pass. ``summary.work_left``
    says that the pass stopped at a bound with groups left to work; ``ahead`` (an `Ahead`)
    is called as soon as the claim shows it.
    """
    run = Run.objects.get(pk=run.pk)
    if not run.is_terminal:
        raise CleanupRefused(f"run {run.pk} is still {run.status}; only a run that has ended is cleaned")
    if reset:
        reset_for_person(run, actor)
    summaries, work_left = run_batch([run.pk], by=actor or by or "", deadline=deadline, skip_locked=False, ahead=ahead)
    summary = summaries.get(run.pk)
    if summary is None:
        summary = Summary(remaining=refresh_cleanup_status(run))
    summary.work_left = work_left
    _count_pass(summary)
    return summary


def _count_pass(summary: Summary) -> None:
    """The pass and its verdicts in the site's metrics (`cleanup.counters`)."""
    counters.add("sweep_passes_total")
    for verdict in ("reverted", "drifted", "failed"):
        if getattr(summary, verdict):
            counters.add("sweep_rows_total", {"verdict": verdict}, getattr(summary, verdict))


def run_batch(
    run_ids: Sequence[int],
    *,
    by: str,
    deadline: dt.datetime | None = None,
    skip_locked: bool = True,
    limit: int | None = None,
    canaries: Collection[tuple[str, str]] = frozenset(),
    health: outages.Snapshot | None = None,
    ahead: Ahead | Callable[[], object] | None = None,
) -> tuple[dict[int, Summary], bool]:
    """One batch of a pass: claim, call, write. Answers ``({run id: Summary}, work_left)``.

    ``work_left`` is true when the batch stopped at a bound (groups per run, or the time
    budget) with work left behind; ``ahead`` is called once the claim shows that a run has
    more groups than it took.
    """
    health = health or outages.Snapshot()
    batch = claims.claim(
        run_ids, uuid.uuid4(), skip_locked=skip_locked, limit=limit, canaries=canaries, down=health.down
    )
    if batch.work_left and ahead is not None:
        ahead()
    if not batch.groups:
        return {}, batch.work_left
    summaries: dict[int, Summary] = {}
    called: list[dispatch.Called] = []
    for group in batch.leases():
        # Rule 13: each lease's verdict is written before the next lease on its target
        # is worked.
        called.append(dispatch.call_lease(group, batch.token, deadline))
        _write(batch, verdicts.write_now, batch.token, called[-1:], summaries, by)

    def answered(some: list[dispatch.Called]) -> None:
        # Written as they answer, while the batch's other calls run: a sweeper killed
        # mid-batch gives back again only what was in flight (rule 9's fence still decides).
        _write(batch, verdicts.write_now, batch.token, some, summaries, by)
        called.extend(some)

    # A claim of several groups marked them called together; a group claimed alone is
    # marked just before its call (rule 20).
    rest = dispatch.call_groups(
        batch.others(),
        deadline,
        health,
        None if batch.called_together else batch.token,
        answered=answered,
        held_until=batch.held_until,
    )
    _write(batch, verdicts.write, batch, rest, by, summaries)
    called += rest
    dispatch.hold_overdue(batch.token, called)
    return summaries, batch.work_left or any(c.verdict is None and not c.handed_down for c in called)


def _write(batch: claims.Batch, writer: Callable[..., _T], *args: Any) -> _T:
    """Write verdicts, again on a new connection while the database is lost and the claim
    holds (`reconnect`).

    The write is fenced by the claim, so writing it twice changes nothing; without a
    verdict the rows would wait for their claim to expire and spend another attempt
    (rule 27).
    """
    return reconnect.retried(writer, *args, until=batch.held_until, what="writing verdicts")


@dataclass
class SweepResult:
    runs: int = 0
    summary: Summary = field(default_factory=Summary)
    released: int = 0
    work_left: bool = False  # stopped at a bound: more may be waiting

    def line(self) -> str:
        s = self.summary
        return (
            f"swept {self.runs} run(s): attempted {s.attempted}, reverted {s.reverted}, "
            f"drifted {s.drifted}, failed {s.failed}, remaining {s.remaining}"
        )


def sweep(by: str = "sweep", deadline: dt.datetime | None = None, ahead: Ahead | None = None) -> SweepResult:
    """The cleanup leg: one pass over at most ``EVENT_CLEANUP_RUN_BATCH`` runs.

    1. One query reads what the pass needs first (`claims.look`): whether dead claims or
       troubled backends need work, and the finder's candidates.
    2. Claims of dead sweepers with no attempt left become visible failures.
    3. Down modules whose probe is due are probed; outages past their bound give up.
    4. The finder names up to twice the batch of runs that owe something; a batch of them
       is claimed, called and written (`run_batch`). When other sweepers were claiming
       every candidate, it looks again, at most ``LOOKS`` times.
    5. Stale run statuses are repaired, always when the pass found nothing to do.

    Past ``deadline`` it starts nothing new, so a task stays well inside django-q2's
    timeout however slow the shards are. ``work_left`` says the pass stopped at a bound
    (runs per batch, groups per run, the time budget) with work left: the caller queues
    the next pass at once, and the schedule is only the backstop. ``ahead`` (an `Ahead`)
    is called as soon as the pass knows it will leave work behind, before its module calls.

    A lost database connection at any statement is retried on a new one (`reconnect`); a
    pass whose database stays away ends quietly with ``work_left``, never with an error.
    """
    try:
        return _pass(by, deadline, ahead)
    except DatabaseError as error:
        if not reconnect.lost(error):
            raise
        # Logged once for the outage by `reconnect`; the next pass tries again.
        connection.close()
        return SweepResult(summary=Summary(), work_left=True)


def _pass(by: str, deadline: dt.datetime | None, ahead: Ahead | None) -> SweepResult:
    result = SweepResult(summary=Summary())
    batch = setting("EVENT_CLEANUP_RUN_BATCH")
    # Twice the batch as candidates: runs other sweepers are claiming are passed over. The
    # finder's first look goes with the pass's other reads, in one query.
    found, spent, troubled = reconnect.retried(claims.look, 2 * batch, until=_until(deadline), what="looking for work")
    result.released = (
        reconnect.retried(verdicts.release_spent_claims, by, until=_until(deadline), what="releasing dead claims")
        if spent
        else 0
    )
    health = outages.Snapshot() if troubled else outages.Snapshot(rows=())
    canaries = reconnect.retried(_outages, health, until=_until(deadline)) if troubled else set()
    repaired = reconnect.retried(_repair_statuses, batch, busy=True, until=_until(deadline))
    summaries: dict[int, Summary] = {}
    work_left = False
    for look in range(LOOKS):
        # A release, a probe or an outage given up may have changed what is claimable since
        # the first look: then the finder looks again.
        fresh = look == 0 and not (spent or troubled)
        run_ids = found if fresh else reconnect.retried(runs_needing_cleanup, 2 * batch, until=_until(deadline))
        result.work_left = len(run_ids) > batch
        if not run_ids or past(deadline):
            break
        if result.work_left and ahead is not None:
            ahead()
        try:
            summaries, work_left = run_batch(
                run_ids, by=by, deadline=deadline, limit=batch, canaries=canaries, health=health, ahead=ahead
            )
        except Exception as error:
            # The claims of a batch that failed expire and are taken again by a later pass;
            # a connection the failure left broken is not used again. A lost database was
            # logged once for its outage (`reconnect`).
            if not reconnect.lost(error):
                logger.exception("cleanup of runs %s failed", run_ids)
            connection.close_if_unusable_or_obsolete()
            summaries, work_left = {}, True
        if summaries or work_left:
            break
        # Every candidate was being claimed by other sweepers at that moment: once their
        # claims commit, the finder names other runs.
        time.sleep(LOOK_AGAIN_S)
    if summaries or work_left:
        for summary in summaries.values():
            result.summary.add(summary)
        result.runs = len(summaries)
        result.work_left = result.work_left or work_left
    if past(deadline):
        result.work_left = True  # a run may have been left with groups to work
    if not (summaries or work_left or repaired):
        reconnect.retried(_repair_statuses, batch, busy=False, until=_until(deadline))
    _count_pass(result.summary)
    return result


def _until(deadline: dt.datetime | None) -> float:
    """How long a statement of the pass may wait for a lost database (monotonic): until the
    pass's deadline, and never longer than `reconnect.READ_FOR_S`."""
    bound = reconnect.READ_FOR_S
    if deadline is not None:
        bound = min(bound, max(0.0, (deadline - timezone.now()).total_seconds()))
    return time.monotonic() + bound


# A busy sweeper repairs stale statuses at most this often; an idle pass always does.
REPAIR_EVERY_S = 30
_last_repair: dict[str, float | None] = {"at": None}


def _repair_statuses(limit: int, busy: bool) -> bool:
    """Repair stale run statuses (`statuses.repair_statuses`): in every pass that finds no
    work, and in a busy sweeper's first pass and then every ``REPAIR_EVERY_S``, so a
    backlog of work costs the repair's query once in a while, not once per batch (rule 24)."""
    at = time.monotonic()
    if busy and _last_repair["at"] is not None and at - _last_repair["at"] < REPAIR_EVERY_S:
        return False
    _last_repair["at"] = at
    statuses.repair_statuses(limit)
    return True


def _outages(health: outages.Snapshot) -> set[tuple[str, str]]:
    """Before a pass: probe the down modules whose probe is due, and end the outages past
    their bound (`cleanup.outages`), on the database's clock. Answers the modules that may
    have one canary call."""
    now = clock.now()
    canaries, given_up = health.before_pass(now)
    for outage in given_up:
        statuses.refresh_statuses(outages.give_up_waiting(outage, now))
    return set(canaries)
