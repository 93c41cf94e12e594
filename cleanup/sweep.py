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
import time
import uuid
from dataclasses import dataclass

from django.db import DatabaseError, connection
from django.utils import timezone

from . import calling, outages, verdicts, work
from .calling import past
from .conf import setting
from .manual import reset_for_person
from .models import Run
from .verdicts import Summary
from .work import runs_needing_cleanup

logger = logging.getLogger(__name__)


# How often a pass looks for work again when other sweepers were claiming all it found.
LOOKS = 3
LOOK_AGAIN_S = 0.05


class CleanupRefused(Exception):
    """A cleanup that cannot be asked for, such as one of a run still in flight."""


class Ahead:
    """Queues the next pass, at most once, as soon as a pass knows it leaves work behind.

    A pass that claimed only part of what waits calls it right after its claim, before its
    module calls: another worker claims the next groups meanwhile, instead of the work
    waiting for this pass to end and for the queue to hand the next one out.
    """

    def __init__(self, queue):
        self._queue = queue
        self.queued = False

    def __call__(self):
        if not self.queued:
            self.queued = True
            self._queue()


def cleanup_run(run, *, reset=False, actor=None, by=None, deadline=None, ahead=None):
    """Give back what one terminal run still holds; answers a `Summary`.

    ``reset`` is a person's request (the admin action, the API, ``cleanup_run --reset``):
    it puts every unresolved row of the run back under the attempt ceiling, as the only
    path that lowers a counter. The automatic sweep never sets it. Past ``deadline`` no
    further group is started; what is left waits for the next pass. ``summary.more``
    says that the pass stopped at a bound with groups left to work; ``ahead`` (an `Ahead`)
    is called as soon as the claim shows it.
    """
    run = Run.objects.get(pk=run.pk)
    if not run.is_terminal:
        raise CleanupRefused(f"run {run.pk} is still {run.status}; only a run that has ended is cleaned")
    if reset:
        reset_for_person(run, actor)
    summaries, more = run_batch([run.pk], by=actor or by, deadline=deadline, skip_locked=False, ahead=ahead)
    summary = summaries.get(run.pk)
    if summary is None:
        summary = Summary(remaining=refresh_cleanup_status(run))
    summary.more = more
    return summary


def run_batch(
    run_ids, *, by, deadline=None, skip_locked=True, limit=None, canaries=frozenset(), health=None, ahead=None
):
    """One batch of a pass: claim, call, write. Answers ``({run id: Summary}, more)``.

    ``more`` is true when the batch stopped at a bound (groups per run, or the time
    budget) with work left behind; ``ahead`` is called once the claim shows that a run has
    more groups than it took.
    """
    health = health or outages.Health()
    batch = work.claim(run_ids, uuid.uuid4(), skip_locked=skip_locked, limit=limit, canaries=canaries, down=health.down)
    if batch.more and ahead is not None:
        ahead()
    if not batch.groups:
        return {}, batch.more
    summaries, called = {}, []
    for group in batch.leases():
        # Rule 13: each lease's verdict is written before the next lease on its target
        # is worked.
        called.append(calling.call_lease(group, batch.token, deadline))
        _write(verdicts.write_now, batch.token, called[-1:], summaries, by)
    rest = calling.call_groups(batch.others(), deadline, health)
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


def sweep(by="sweep", deadline=None, ahead=None):
    """The cleanup leg: one pass over at most ``EVENT_CLEANUP_RUN_BATCH`` runs.

    Past ``deadline`` it starts nothing new, so a task stays well inside django-q2's
    timeout however slow the shards are. ``full`` says the pass stopped at a bound (runs
    per batch, groups per run, the time budget) with work left: the caller queues the
    next pass at once, and the schedule is only the backstop. ``ahead`` (an `Ahead`) is
    called as soon as the pass knows it will leave work behind, before its module calls.
    """
    now = timezone.now()
    result = SweepResult(summary=Summary())
    result.released = verdicts.release_spent_claims(now, by)
    batch = setting("EVENT_CLEANUP_RUN_BATCH")
    health = outages.Health()
    canaries = _outages(health, now)
    repaired = _repair_statuses(batch, busy=True)
    summaries, more = {}, False
    for _look in range(LOOKS):
        # Twice the batch as candidates: runs other sweepers are claiming are passed over.
        run_ids = runs_needing_cleanup(timezone.now(), 2 * batch)
        result.full = len(run_ids) > batch
        if not run_ids or past(deadline):
            break
        if result.full and ahead is not None:
            ahead()
        try:
            summaries, more = run_batch(
                run_ids, by=by, deadline=deadline, limit=batch, canaries=canaries, health=health, ahead=ahead
            )
        except Exception:
            # The claims of a batch that failed expire and are taken again by a later pass.
            logger.exception("cleanup of runs %s failed", run_ids)
            summaries, more = {}, True
        if summaries or more:
            break
        # Every candidate was being claimed by other sweepers at that moment: once their
        # claims commit, the finder names other runs.
        time.sleep(LOOK_AGAIN_S)
    if summaries or more:
        for summary in summaries.values():
            result.summary.add(summary)
        result.runs = len(summaries)
        result.full = result.full or more
    if past(deadline):
        result.full = True  # a run may have been left with groups to work
    if not (summaries or more or repaired):
        _repair_statuses(batch, busy=False)
    return result


# A busy sweeper repairs stale statuses at most this often; an idle pass always does.
REPAIR_EVERY_S = 30
_last_repair = {"at": None}


def _repair_statuses(limit, busy):
    """Repair stale run statuses (`verdicts.repair_statuses`): in every pass that finds no
    work, and in a busy sweeper's first pass and then every ``REPAIR_EVERY_S``, so a
    backlog of work costs the repair's query once in a while, not once per batch."""
    at = time.monotonic()
    if busy and _last_repair["at"] is not None and at - _last_repair["at"] < REPAIR_EVERY_S:
        return False
    _last_repair["at"] = at
    verdicts.repair_statuses(limit)
    return True


def _outages(health, now):
    """Before a pass: probe the down modules whose probe is due, and end the outages past
    their bound (`cleanup.outages`). Answers the modules that may have one canary call."""
    canaries, given_up = health.before_pass(now)
    for outage in given_up:
        verdicts.refresh_statuses(outages.give_up_waiting(outage, now))
    return canaries
