"""Writing what a batch's calls answered: rows, attempts, log entries and run statuses, in one transaction.

A verdict lands only on rows its claim still holds (same token, still ``reverting``): the
UPDATE that writes the rows is fenced by the claim and answers which rows it wrote, so the
attempts, the log and the counts name exactly the rows that changed, and a sweeper whose
claim was taken over writes nothing at all, not even a pass summary. The statuses of the
batch's runs (`statuses`) are written in the same transaction as their rows, so a sweeper
that dies leaves both as they were or both as they are now.

A batch costs a fixed number of statements however many groups it holds: the runs locked,
then the rows and their attempts (`rows.write_verdicts`, one statement); the runs' counts,
their statuses and the log (`statuses.write_statuses`, one statement). A row given back has no attempt of its own in the
history: the row itself says it (``reverted``, its attempt number, when), and the pass's
``cleanup.swept`` entry who (`rows.history`).
May import: the models, conf, `cleanup.rows` (every transition), `cleanup.sql`, `outages`, `calls`, and
`statuses`.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import clock, outages, rows
from ..calls import Outcome, Verdict
from ..conf import claim_timeout_s, max_revert_attempts
from ..models import STEP_KIND, Attempt, AttemptOutcome, LogKind, Resource, RunLog
from ..rows import DEAD_CLAIM, AttemptRecord
from ..sql import execute_prepared, inserting_json
from .statuses import LOG_FIELDS, LogRow, lock_runs, write_statuses

if TYPE_CHECKING:
    from .claims import Batch, Group, Row
    from .dispatch import Called

logger = logging.getLogger(__name__)


# What a row's verdict counts in its run's summary.
REVERTED, DRIFTED, FAILED = "reverted", "drifted", "failed"


@dataclass
class Summary:
    attempted: int = 0
    reverted: int = 0
    drifted: int = 0
    failed: int = 0
    remaining: int = 0
    work_left: bool = False  # the pass stopped at a bound with groups of the run left to work

    def add(self, other: Summary) -> None:
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.work_left = self.work_left or other.work_left

    def logged(self, by: str) -> dict[str, Any]:
        """The detail of the run's ``cleanup.swept`` entry (rule 11)."""
        return {**{name: getattr(self, name) for name in COUNTS}, "by": by}


COUNTS = ("attempted", "reverted", "drifted", "failed", "remaining")

# One row's transition: the row, the columns its verdict writes, what it counts (or None).
Staged = tuple["Row", rows.Verdict, str | None]


def write(
    batch: Batch, called: Sequence[Called], by: str, summaries: dict[int, Summary] | None = None
) -> dict[int, Summary]:
    """Write the verdicts of a batch, its log and its runs' statuses; answers a `Summary` per run.

    ``summaries`` carries what earlier writes of the same batch counted (its leases). Every
    time written is the database's (`cleanup.clock`).
    """
    summaries = summaries if summaries is not None else {}
    with transaction.atomic():
        runs = lock_runs(batch.run_ids)
        entries = _write_rows(batch.token, called, summaries, by)
        # Each run's ``cleanup.swept`` entry: its ``remaining`` is counted with its status.
        swept = [
            (run_id, LogKind.CLEANUP_SWEPT, summaries[run_id].logged(by))
            for run_id in runs
            if run_id in summaries and summaries[run_id].attempted
        ]
        answer = write_statuses(runs, None, entries, swept)
    for run_id, (_status, remaining) in answer.items():
        summaries.setdefault(run_id, Summary()).remaining = remaining
    return summaries


def write_now(token: uuid.UUID, called: Sequence[Called], summaries: dict[int, Summary], by: str = "") -> None:
    """Write some verdicts and their log at once, before the rest of the batch (a lease's,
    which the next lease on its target must see); the batch's `write` adds the statuses."""
    with transaction.atomic():
        entries = _write_rows(token, called, summaries, by)
        if entries:
            execute_prepared(*inserting_json(RunLog, LOG_FIELDS, entries, fixed_sql={"at": clock.SQL}))


def _write_rows(
    token: uuid.UUID, called: Sequence[Called], summaries: dict[int, Summary], by: str = ""
) -> list[LogRow]:
    """Write the rows of ``called`` still held by ``token``, with the attempts of those not
    given back; count them in ``summaries``; answers their log entries."""
    # Before the rows: the health rows of the backends the answers blamed are locked, as a
    # mark-down locks them before it forgives the rows' attempts; either it came first and
    # these rows wait, or it comes after this commit and forgives what they spent.
    _note_waiting(called)
    # A step whose rows are on several backends is several groups: written row by row.
    steps = [r.group.key for r in called if r.group.kind == "step"]
    split = {key for key in steps if steps.count(key) > 1}
    changes = _Changes(split)
    attempts: list[AttemptRecord] = []
    answered: list[tuple[Called, list[Staged]]] = []
    for result in called:
        group = result.group
        if result.handed_down:  # resolved and logged by its own fenced hand-down
            summary = summaries.setdefault(group.run_id, Summary())
            summary.attempted += len(group.rows)
            summary.reverted += 1
            continue
        if result.verdict is None:
            # The pass's time ran out before the call: the claim is given back, and its attempt.
            given_back = rows.give_back_claim()
            changes.stage(group, [(row, given_back, None) for row in group.rows])
            continue
        staged = _transitions(result)
        changes.stage(group, staged)
        attempts.extend(_attempts(result, staged))
        answered.append((result, staged))
    written = rows.write_verdicts(token, changes.steps, changes.rows, attempts, by) if changes else set()
    entries = []
    for result, staged in answered:
        mine = [(row, counted) for row, _values, counted in staged if row.pk in written]
        if not mine:
            logger.warning(
                "the verdict on %s for run %s came after its claim was taken over", result.what, result.group.run_id
            )
            continue
        summary = summaries.setdefault(result.group.run_id, Summary())
        summary.attempted += len(mine)
        for _row, counted in mine:
            if counted is not None:
                setattr(summary, counted, getattr(summary, counted) + 1)
        entries.append(_log_entry(result, [row for row, _ in mine]))
    return entries


def _note_waiting(called: Sequence[Called]) -> None:
    """Which answers that blamed a backend came from a backend that is down now, and how
    long after the write their rows wait (till its next probe, on the database's clock).

    Read when the verdicts are written, after every answer of the batch was counted, so
    the answers that together showed the outage all wait and none spends an attempt.
    """
    blamed = sorted({(r.module, r.backend) for r in called if r.blamed is not None and r.module})
    if not blamed:
        return
    outages.lock_health(blamed)
    now = clock.now()
    until = {pair: outages.waiting_until(pair[0], now, backend=pair[1]) for pair in blamed}
    for result in called:
        if result.blamed is not None and result.module:
            waits = until[(result.module, result.backend)]
            result.waited = None if waits is None else max(waits - now, timedelta(0))


def _attempts(result: Called, staged: Iterable[Staged]) -> Iterator[AttemptRecord]:
    """The attempt of each row not given back, for its own history (recorded with the rows,
    for those the claim still held). A row given back is its own record (`rows.history`)."""
    verdict = result.verdict
    assert verdict is not None
    for row, _values, counted in staged:
        if counted == REVERTED:
            continue
        outcome, error = str(verdict.outcome), verdict.error
        if result.waited is not None:
            outcome = AttemptOutcome.WAITED  # its module is down: this attempt is not counted
        elif result.blamed is not None and verdict.outcome != Outcome.DONE:
            outcome = AttemptOutcome.UNAVAILABLE  # counted; forgiven if the module is found down after it
        if verdict.outcome == Outcome.DONE and row.ref in verdict.failed and row.kind != STEP_KIND:
            outcome, error = AttemptOutcome.FAILED, not_given_back(result.what, row, verdict)
        yield row.pk, row.run_id, row.revert_attempts, str(outcome), error


def _transitions(result: Called) -> list[Staged]:
    """The transition each row of the group's verdict writes (`cleanup.rows`), and what it counts.

    A whole group given back takes one set of values, made once.
    """
    verdict = result.verdict
    assert verdict is not None
    group_rows = result.group.rows
    if verdict.outcome == Outcome.DONE and not (verdict.failed and any(r.ref in verdict.failed for r in group_rows)):
        given_back = rows.given_back()
        return [(row, given_back, REVERTED) for row in group_rows]
    return [_values(result, verdict, row) for row in group_rows]


def _values(result: Called, verdict: Verdict, row: Row) -> Staged:
    """The transition one row's verdict writes (`cleanup.rows`), and what it counts."""
    # A call still running past its budget keeps its rows claimed (renewed by `dispatch`)
    # until it ends, so it is never retried while it may still act (rule 18).
    keep = timedelta(seconds=claim_timeout_s()) if result.running is not None else None
    if verdict.outcome == Outcome.DONE:
        if row.ref in verdict.failed and row.kind != STEP_KIND:
            error = not_given_back(result.what, row, verdict)
            return row, rows.fail(error, row.revert_attempts, max_revert_attempts()), FAILED
        return row, rows.given_back(), REVERTED
    if result.waited is not None and verdict.outcome == Outcome.RETRY:
        # Its module's backend is down: the failure is the outage's, not the row's. The
        # attempt is given back and the row waits for the module (`cleanup.outages`).
        return row, rows.wait(verdict.error, result.waited, keep), None
    if verdict.outcome == Outcome.DRIFTED:
        return row, rows.drift(verdict.error), DRIFTED
    if verdict.outcome == Outcome.TERMINAL:
        return row, rows.fail_for_good(verdict.error), FAILED
    return row, rows.fail(verdict.error, row.revert_attempts, max_revert_attempts(), keep), FAILED


def not_given_back(what: str | None, row: Row, verdict: Verdict) -> str:
    """A failed row's own error: the module's reason for it first, when it gave one, as
    what a person reads to decide what to do (a list shows the start of it)."""
    reason = verdict.reasons.get(row.ref)
    said = f"{what} could not give back {row.ref}"
    return f"{reason} ({said})" if reason else said


def _log_entry(result: Called, written: Sequence[Row]) -> LogRow:
    verdict = result.verdict
    assert verdict is not None
    detail: dict[str, Any] = {
        "what": result.what,
        "outcome": str(verdict.outcome),
        "resources": [f"{r.kind}:{r.ref}" for r in written],
    }
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
    return result.group.run_id, kind, detail


class _Changes:
    """The batch's row changes: per step for a step whose rows all take the same values,
    per row for the rest, written by one UPDATE for each of the two."""

    def __init__(self, split: Iterable[int] = frozenset()) -> None:
        self.split = set(split)  # steps with groups on several backends: staged by row
        self.rows: dict[int, rows.Verdict] = {}  # row id -> columns, for rows not staged with their whole step
        self.steps: dict[int, rows.Verdict] = {}  # step id -> columns, for a step's rows that all take the same

    def __bool__(self) -> bool:
        return bool(self.rows or self.steps)

    def stage(self, group: Group, staged: Sequence[Staged]) -> None:
        if not staged:
            return
        first = staged[0][1]
        same = all(values is first or values == first for _row, values, _counted in staged)
        if group.kind == "step" and group.key not in self.split and same:
            self.steps[group.key] = first
        else:
            self.rows.update((row.pk, values) for row, values, _counted in staged)


def release_spent_claims(by: str = "") -> int:
    """Claims of dead sweepers with no attempt left become failures a person can see, logged
    (`rows.release_spent_claims`, rule 20).

    Only claims whose call started alone: a sweeper that died before calling, or in a wave
    of calls, spent nothing, and the claim that takes its rows over gives the attempt back. Answers how many rows
    were released.
    """
    max_attempts = max_revert_attempts()
    run_ids = rows.runs_with_spent_claims(max_attempts)
    if not run_ids:
        return 0
    with transaction.atomic():
        runs = lock_runs(run_ids)
        now = clock.now()
        released = rows.release_spent_claims(max_attempts)
        RunLog.objects.bulk_create(_expired_entries(released, now))
        Attempt.record(released, AttemptOutcome.EXPIRED, DEAD_CLAIM, by=by, at=now)
        write_statuses(runs, now)
    return len(released)


def _expired_entries(released: Sequence[Resource], now: dt.datetime) -> Iterator[RunLog]:
    """One ``cleanup.failed`` entry per run, naming its rows whose sweeper died."""
    by_run: dict[int, list[str]] = {}
    for row in released:
        by_run.setdefault(row.run_id, []).append(f"{row.kind}:{row.ref}")
    for run_id, resources in by_run.items():
        detail = {"outcome": AttemptOutcome.EXPIRED, "resources": resources, "error": DEAD_CLAIM}
        yield RunLog(run_id=run_id, kind=LogKind.CLEANUP_FAILED, at=now, detail=detail)
