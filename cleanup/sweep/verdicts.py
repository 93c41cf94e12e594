"""Writing what a batch's calls answered: rows, attempts, log entries and run statuses, in one transaction.

A verdict lands only on rows its claim still holds (same token, still ``reverting``):
the rows are locked first, so the log names exactly the rows that changed, and a
sweeper whose claim was taken over writes nothing at all, not even a pass summary. The
statuses of the batch's runs (`statuses`) are written in the same transaction as their
rows, so a sweeper that dies leaves both as they were or both as they are now.
May import: the models, conf, `cleanup.rows` (every transition), `cleanup.sql`, `outages`, `calls`, and
`statuses`.
"""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from .. import outages, rows
from ..calls import Outcome
from ..conf import claim_timeout_s, max_revert_attempts
from ..models import STEP_KIND, Attempt, AttemptOutcome, LogKind, Resource, RunLog
from ..rows import DEAD_CLAIM
from ..sql import insert
from .statuses import lock_runs, write_statuses

logger = logging.getLogger(__name__)

# What a pass writes of each log entry and attempt (`sql.insert`).
LOG_FIELDS = ("run", "kind", "detail", "at")
ATTEMPT_FIELDS = ("resource", "run", "number", "at", "outcome", "error", "by")


@dataclass
class Summary:
    attempted: int = 0
    reverted: int = 0
    drifted: int = 0
    failed: int = 0
    remaining: int = 0
    work_left: bool = False  # the pass stopped at a bound with groups of the run left to work

    def add(self, other):
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.work_left = self.work_left or other.work_left

    def logged(self, by):
        """The detail of the run's ``cleanup.swept`` entry (rule 11)."""
        return {**{name: getattr(self, name) for name in COUNTS}, "by": by}


COUNTS = ("attempted", "reverted", "drifted", "failed", "remaining")


def write(batch, called, by, summaries=None):
    """Write the verdicts of a batch, its log and its runs' statuses; answers a `Summary` per run.

    ``summaries`` carries what earlier writes of the same batch counted (its leases).
    """
    now = timezone.now()
    summaries = summaries if summaries is not None else {}
    with transaction.atomic():
        runs = lock_runs(batch.run_ids)
        entries = _write_rows(batch.token, called, summaries, now, by)
        for run_id, (_status, remaining) in write_statuses(runs, now).items():
            summary = summaries.setdefault(run_id, Summary())
            summary.remaining = remaining
            if summary.attempted:
                entries.append(RunLog(run_id=run_id, kind=LogKind.CLEANUP_SWEPT, at=now, detail=summary.logged(by)))
        insert(entries, LOG_FIELDS)
    return summaries


def write_now(token, called, summaries, by=""):
    """Write some verdicts and their log at once, before the rest of the batch (a lease's,
    which the next lease on its target must see); the batch's `write` adds the statuses."""
    now = timezone.now()
    with transaction.atomic():
        insert(_write_rows(token, called, summaries, now, by), LOG_FIELDS)


def _write_rows(token, called, summaries, now, by=""):
    """Stage and write the rows of ``called`` still held by ``token``, with an `Attempt` for
    each; answers their log entries."""
    # Before the rows: the health rows of the backends the answers blamed are locked, as a
    # mark-down locks them before it forgives the rows' attempts; either it came first and
    # these rows wait, or it comes after this commit and forgives what they spent.
    _note_waiting(called, now)
    held = set(rows.lock(Resource.objects.filter(rows.held_by(token))).values_list("id", flat=True))
    # A step whose rows are on several backends is several groups: written row by row.
    steps = [r.group.key for r in called if r.group.kind == "step"]
    split = {key for key in steps if steps.count(key) > 1}
    changes, entries, attempts = _Changes(now, split), [], []
    for result in called:
        summary = summaries.setdefault(result.group.run_id, Summary())
        entry = _one(result, held, changes, summary, now)
        if entry is not None:
            entries.append(entry)
            attempts.extend(_attempts(result, held, now, by))
    changes.apply(token)
    insert(attempts, ATTEMPT_FIELDS)
    return entries


def _note_waiting(called, now):
    """Which answers that blamed a backend came from a backend that is down now.

    Read when the verdicts are written, after every answer of the batch was counted, so
    the answers that together showed the outage all wait and none spends an attempt.
    """
    blamed = sorted({(r.module, r.backend) for r in called if r.blamed is not None and r.module})
    if not blamed:
        return
    outages.lock_health(blamed)
    until = {pair: outages.waiting_until(pair[0], now, backend=pair[1]) for pair in blamed}
    for result in called:
        if result.blamed is not None and result.module:
            result.waited = until[(result.module, result.backend)]


def _attempts(result, held, now, by):
    """Each written row's attempt, for its own history (one insert for the batch)."""
    verdict = result.verdict
    for row in result.group.rows:
        if row.pk not in held:
            continue
        outcome, error = str(verdict.outcome), verdict.error
        if result.waited is not None:
            outcome = AttemptOutcome.WAITED  # its module is down: this attempt is not counted
        elif result.blamed is not None and verdict.outcome != Outcome.DONE:
            outcome = AttemptOutcome.UNAVAILABLE  # counted; forgiven if the module is found down after it
        if verdict.outcome == Outcome.DONE and row.ref in verdict.failed and row.kind != STEP_KIND:
            outcome, error = AttemptOutcome.FAILED, not_given_back(result.what, row, verdict)
        yield Attempt(
            resource_id=row.pk,
            run_id=row.run_id,
            number=row.revert_attempts,
            at=now,
            outcome=outcome,
            error=error,
            by=by or "",
        )


def _one(result, held, changes, summary, now):
    """Stage one group's verdict; answers its log entry, or None."""
    group = result.group
    if result.handed_down:  # resolved and logged by its own fenced hand-down
        summary.attempted += len(group.rows)
        summary.reverted += 1
        return None
    mine = [r for r in group.rows if r.pk in held]
    if result.verdict is None:
        changes.stage(group, mine, _not_started)
        return None
    if not mine:
        logger.warning("the verdict on %s for run %s came after its claim was taken over", result.what, group.run_id)
        return None
    summary.attempted += len(mine)
    changes.stage(group, mine, lambda row: _values(result, row, summary, now))
    return _log_entry(result, mine, now)


def _not_started(row):
    """The pass's time ran out before the call: the claim is given back, and its attempt."""
    return rows.give_back_claim()


def _values(result, row, summary, now):
    """The transition one row's verdict writes (`cleanup.rows`), counted in ``summary``."""
    verdict = result.verdict
    # A call still running past its budget keeps its rows claimed (renewed by `dispatch`)
    # until it ends, so it is never retried while it may still act (rule 18).
    keep = now + timedelta(seconds=claim_timeout_s()) if result.running is not None else None
    if verdict.outcome == Outcome.DONE:
        if row.ref in verdict.failed and row.kind != STEP_KIND:
            summary.failed += 1
            return rows.fail(not_given_back(result.what, row, verdict), row.revert_attempts, now, max_revert_attempts())
        summary.reverted += 1
        return rows.given_back(now)
    if result.waited is not None and verdict.outcome == Outcome.RETRY:
        # Its module's backend is down: the failure is the outage's, not the row's. The
        # attempt is given back and the row waits for the module (`cleanup.outages`).
        return rows.wait(verdict.error, result.waited, keep)
    if verdict.outcome == Outcome.DRIFTED:
        summary.drifted += 1
        return rows.drift(verdict.error)
    summary.failed += 1
    if verdict.outcome == Outcome.TERMINAL:
        return rows.fail_for_good(verdict.error)
    return rows.fail(verdict.error, row.revert_attempts, now, max_revert_attempts(), keep)


def not_given_back(what, row, verdict):
    """A failed row's own error: the module's reason for it first, when it gave one, as
    what a person reads to decide what to do (a list shows the start of it)."""
    reason = verdict.reasons.get(row.ref)
    said = f"{what} could not give back {row.ref}"
    return f"{reason} ({said})" if reason else said


def _log_entry(result, written, now):
    verdict = result.verdict
    detail = {"what": result.what, "outcome": str(verdict.outcome), "resources": [f"{r.kind}:{r.ref}" for r in written]}
    if verdict.error:
        detail["error"] = verdict.error
    if verdict.outcome == Outcome.DONE and verdict.failed:
        detail["failed"] = sorted(verdict.failed)
        if verdict.reasons:
            detail["reasons"] = dict(sorted(verdict.reasons.items()))
    if verdict.outcome == Outcome.DRIFTED:
        detail["current"] = verdict.current
    kind = (
        LogKind.CLEANUP_REVERTED if verdict.outcome == Outcome.DONE and not verdict.failed else LogKind.CLEANUP_FAILED
    )
    return RunLog(run_id=result.group.run_id, kind=kind, at=now, detail=detail)


class _Changes:
    """The batch's row changes: per step for a step whose rows all take the same values,
    per row for the rest, written by one UPDATE for each of the two."""

    def __init__(self, now, split=frozenset()):
        self.now = now
        self.split = split  # steps with groups on several backends: staged by row
        self.rows = {}  # row id -> {column: value}, for rows not staged with their whole step
        self.steps = {}  # step id -> {column: value}, for a step's rows that all take the same

    def stage(self, group, staged, values_of):
        of_row = {row.pk: values_of(row) for row in staged}
        same = len({tuple(sorted(values.items())) for values in of_row.values()}) == 1
        whole = group.kind == "step" and group.key not in self.split
        if whole and same and len(staged) == len(group.rows):
            self.steps[group.key] = of_row[staged[0].pk]
        else:
            self.rows.update(of_row)

    def apply(self, token):
        if self.steps or self.rows:
            rows.write_verdicts(token, self.steps, self.rows, self.now)


def release_spent_claims(now, by=""):
    """Claims of dead sweepers with no attempt left become failures a person can see, logged
    (`rows.release_spent_claims`, rule 20).

    Only claims whose call started alone: a sweeper that died before calling, or in a wave
    of calls, spent nothing, and the claim that takes its rows over gives the attempt back. Answers how many rows
    were released.
    """
    max_attempts = max_revert_attempts()
    run_ids = rows.runs_with_spent_claims(now, max_attempts)
    if not run_ids:
        return 0
    with transaction.atomic():
        runs = lock_runs(run_ids)
        released = rows.release_spent_claims(now, max_attempts)
        RunLog.objects.bulk_create(_expired_entries(released, now))
        Attempt.record(released, AttemptOutcome.EXPIRED, DEAD_CLAIM, by=by, at=now)
        write_statuses(runs, now)
    return len(released)


def _expired_entries(released, now):
    """One ``cleanup.failed`` entry per run, naming its rows whose sweeper died."""
    by_run = {}
    for row in released:
        by_run.setdefault(row.run_id, []).append(f"{row.kind}:{row.ref}")
    for run_id, resources in by_run.items():
        detail = {"outcome": AttemptOutcome.EXPIRED, "resources": resources, "error": DEAD_CLAIM}
        yield RunLog(run_id=run_id, kind=LogKind.CLEANUP_FAILED, at=now, detail=detail)
