"""Writing what a batch's calls answered: rows, attempts, log entries and run statuses, in one transaction.

A verdict lands only on rows its claim still holds (same token, still ``reverting``):
the rows are locked first, so the log names exactly the rows that changed, and a
sweeper whose claim was taken over writes nothing at all, not even a pass summary. The
statuses of the batch's runs (`statuses`) are written in the same transaction as their
rows, so a sweeper that dies leaves both as they were or both as they are now.
May import: the models, conf, `outages`, `calls`, and `statuses`, `sets`, `statements`.
"""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from .. import outages
from ..calls import Outcome
from ..conf import claim_timeout_s, max_revert_attempts, setting
from ..models import (
    LEASE_KIND,
    STEP_KIND,
    Attempt,
    AttemptOutcome,
    LogKind,
    Resource,
    ResourceState,
    RunLog,
)
from . import sets
from .statuses import lock_runs, write_statuses

logger = logging.getLogger(__name__)

DEAD_CLAIM = "the sweeper that claimed this stopped before it had an answer"
LONGEST_BACKOFF = timedelta(days=30)
# What a pass writes of each log entry and attempt (`sets.insert`).
LOG_FIELDS = ("run", "kind", "detail", "at")
ATTEMPT_FIELDS = ("resource", "run", "number", "at", "outcome", "error", "by")


class _Derived:
    """A column's new value that the write derives from the row as it was, by name."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


# The state before the claim: a row never tried goes back to live, one that failed before
# stays failed.
PREVIOUS_STATE = _Derived("PREVIOUS_STATE")
# The claim's attempt is given back: the row's counter goes down by one.
ATTEMPT_GIVEN_BACK = _Derived("ATTEMPT_GIVEN_BACK")


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
        sets.insert(entries, LOG_FIELDS)
    return summaries


def write_now(token, called, summaries, by=""):
    """Write some verdicts and their log at once, before the rest of the batch (a lease's,
    which the next lease on its target must see); the batch's `write` adds the statuses."""
    now = timezone.now()
    with transaction.atomic():
        sets.insert(_write_rows(token, called, summaries, now, by), LOG_FIELDS)


def _write_rows(token, called, summaries, now, by=""):
    """Stage and write the rows of ``called`` still held by ``token``, with an `Attempt` for
    each; answers their log entries."""
    # Before the rows: the health rows of the backends the answers blamed are locked, as a
    # mark-down locks them before it forgives the rows' attempts; either it came first and
    # these rows wait, or it comes after this commit and forgives what they spent.
    _note_waiting(called, now)
    held = set(Resource.objects.select_for_update().held_by(token).values_list("id", flat=True))
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
    sets.insert(attempts, ATTEMPT_FIELDS)
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
    rows = [r for r in group.rows if r.pk in held]
    if result.verdict is None:
        changes.stage(group, rows, _not_started)
        return None
    if not rows:
        logger.warning("the verdict on %s for run %s came after its claim was taken over", result.what, group.run_id)
        return None
    summary.attempted += len(rows)
    changes.stage(group, rows, lambda row: _values(result, row, summary, now))
    return _log_entry(result, rows, now)


def _not_started(row):
    """The pass's time ran out before the call: the claim is given back, and its attempt."""
    return {
        "state": PREVIOUS_STATE,
        "revert_attempts": ATTEMPT_GIVEN_BACK,
        "claim_token": None,
        "claim_expires_at": None,
    }


def _values(result, row, summary, now):
    """The columns one row's verdict writes (and counts it in ``summary``)."""
    verdict = result.verdict
    release = {"claim_token": None, "claim_expires_at": None}
    if verdict.outcome == Outcome.DONE:
        if row.ref in verdict.failed and row.kind != STEP_KIND:
            summary.failed += 1
            error = not_given_back(result.what, row, verdict)
            return {
                "state": ResourceState.FAILED,
                "last_error": error,
                "next_attempt_at": _retry_at(row, now),
                **release,
            }
        summary.reverted += 1
        return {"state": ResourceState.REVERTED, "last_error": "", "resolved_at": now, **release}
    if result.waited is not None and verdict.outcome == Outcome.RETRY:
        # Its module's backend is down: the failure is the outage's, not the row's. The
        # attempt is given back and the row waits for the module (`cleanup.outages`).
        if result.running is not None:  # still held while the call runs, as below
            release = {"claim_expires_at": now + timedelta(seconds=claim_timeout_s())}
        return {
            "state": ResourceState.FAILED,
            "revert_attempts": ATTEMPT_GIVEN_BACK,
            "last_error": verdict.error,
            "next_attempt_at": result.waited,
            **release,
        }
    if verdict.outcome == Outcome.DRIFTED:
        summary.drifted += 1
        return {"state": ResourceState.DRIFTED, "last_error": verdict.error, **release}
    summary.failed += 1
    if verdict.outcome == Outcome.TERMINAL:
        return {"state": ResourceState.FAILED, "last_error": verdict.error, "retryable": False, **release}
    if result.running is not None:
        # The call is still running: its rows stay held (renewed by `dispatch`)
        # until it ends, so it is never retried while it may still act.
        release = {"claim_expires_at": now + timedelta(seconds=claim_timeout_s())}
    return {
        "state": ResourceState.FAILED,
        "last_error": verdict.error,
        "next_attempt_at": _retry_at(row, now),
        **release,
    }


def not_given_back(what, row, verdict):
    """A failed row's own error: the module's reason for it first, when it gave one, as
    what a person reads to decide what to do (a list shows the start of it)."""
    reason = verdict.reasons.get(row.ref)
    said = f"{what} could not give back {row.ref}"
    return f"{reason} ({said})" if reason else said


def _retry_at(row, now):
    """A retryable failure waits out a backoff that doubles with each attempt; a row with
    no attempt left waits for nothing (a person's retry clears the counter)."""
    if row.revert_attempts >= max_revert_attempts():
        return None
    seconds = setting("EVENT_REVERT_BACKOFF_S") * 2 ** max(0, row.revert_attempts - 1)
    return now + min(timedelta(seconds=seconds), LONGEST_BACKOFF)


def _log_entry(result, rows, now):
    verdict = result.verdict
    detail = {"what": result.what, "outcome": str(verdict.outcome), "resources": [f"{r.kind}:{r.ref}" for r in rows]}
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

    def stage(self, group, rows, values_of):
        of_row = {row.pk: values_of(row) for row in rows}
        same = len({tuple(sorted(values.items())) for values in of_row.values()}) == 1
        whole = group.kind == "step" and group.key not in self.split
        if whole and same and len(rows) == len(group.rows):
            self.steps[group.key] = of_row[rows[0].pk]
        else:
            self.rows.update(of_row)

    def apply(self, token):
        if not (self.steps or self.rows):
            return
        if connection.vendor == "postgresql":
            self._apply_arrays(token)
            return
        updates = {column: self._case(column, by_value) for column, by_value in self._columns().items()}
        # The rows still held were locked by this transaction (`_write_rows`): only they
        # carry the token and match a WHEN. `held_by` reads them through the index of
        # claimed rows, not the whole ledger.
        Resource.objects.held_by(token).update(**updates, updated_at=self.now)

    def _columns(self):
        """``{column: {value: ([step ids], [row ids])}}``, for the ORM's CASEs."""
        columns = {}
        for position, staged in ((0, self.steps), (1, self.rows)):
            for key, values in staged.items():
                for column, value in values.items():
                    columns.setdefault(column, {}).setdefault(value, ([], []))[position].append(key)
        return columns

    def _apply_arrays(self, token):
        """The same write as one UPDATE over arrays of per-row values (`sets`)."""
        held = "r.claim_token = %s AND r.state = %s"
        # By step for the steps whose rows all take the same values (a step's rows but its
        # leases), by row for the rest: a batch of large groups sends a value per group.
        for changed, key, where in ((self.steps, "step", f"{held} AND NOT (r.kind = %s)"), (self.rows, None, held)):
            if not changed:
                continue
            marked = {
                k: {c: sets.SPECIAL if isinstance(v, _Derived) else v for c, v in vs.items()}
                for k, vs in changed.items()
            }
            sets.update_by_id(
                Resource,
                marked,
                where=where,
                where_params=[token, ResourceState.REVERTING.value, *([LEASE_KIND] if key else [])],
                expressions={
                    # A row never tried stays live; one that failed before stays failed.
                    "state": f"CASE WHEN r.last_error = '' THEN '{ResourceState.LIVE.value}' "
                    f"ELSE '{ResourceState.FAILED.value}' END",
                    "revert_attempts": "r.revert_attempts - 1",
                },
                fixed={"updated_at": self.now},
                key=key,
            )

    def _case(self, column, by_value):
        field = Resource._meta.get_field(column)
        whens = []
        for value, (steps, pks) in by_value.items():
            where = Q(pk__in=pks) | (Q(step_id__in=steps) & ~Q(kind=LEASE_KIND))
            if value is PREVIOUS_STATE:
                # A row never tried stays live; one that failed before stays failed.
                whens.append(When(where & Q(last_error=""), then=Value(ResourceState.LIVE.value)))
                value = ResourceState.FAILED.value
            if value is ATTEMPT_GIVEN_BACK:
                whens.append(When(where, then=F("revert_attempts") - 1))
                continue
            whens.append(When(where, then=Value(value, output_field=field)))
        return Case(*whens, default=F(column), output_field=field)


def release_spent_claims(now, by=""):
    """Claims of dead sweepers with no attempt left become failures a person can see, logged.

    Only claims whose call started alone: a sweeper that died before calling, or in a wave
    of calls, spent nothing, and the claim that takes its rows over gives the attempt back. Answers how many rows
    were released.
    """
    spent = Resource.objects.filter(
        state=ResourceState.REVERTING,
        claim_expires_at__lt=now,
        revert_attempts__gte=max_revert_attempts(),
        claim_called=True,
        claim_shared=False,
    )
    run_ids = set(spent.values_list("run_id", flat=True))
    if not run_ids:
        return 0
    with transaction.atomic():
        runs = lock_runs(run_ids)
        rows = list(spent.select_for_update().order_by("id").only("id", "run_id", "kind", "ref", "revert_attempts"))
        Resource.objects.filter(pk__in=[r.pk for r in rows]).update(
            state=ResourceState.FAILED, claim_token=None, claim_expires_at=None, last_error=DEAD_CLAIM, updated_at=now
        )
        RunLog.objects.bulk_create(_expired_entries(rows, now))
        Attempt.record(rows, AttemptOutcome.EXPIRED, DEAD_CLAIM, by=by, at=now)
        write_statuses(runs, now)
    return len(rows)


def _expired_entries(rows, now):
    """One ``cleanup.failed`` entry per run, naming its rows whose sweeper died."""
    by_run = {}
    for row in rows:
        by_run.setdefault(row.run_id, []).append(f"{row.kind}:{row.ref}")
    for run_id, resources in by_run.items():
        detail = {"outcome": AttemptOutcome.EXPIRED, "resources": resources, "error": DEAD_CLAIM}
        yield RunLog(run_id=run_id, kind=LogKind.CLEANUP_FAILED, at=now, detail=detail)
