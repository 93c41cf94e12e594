"""The ledger row's owner: what a row is (its predicates) and what happens to it (its transitions).

Every question about a row ("may the sweep claim it now?", "will the sweep try it
again?", "may a person act on it?") is answered here, once, as a `Q` built by one function.
The same `Q` filters a queryset, compiles to the SQL the pass prepares
(`cleanup.sweep.statements` compiles these, never its own), and answers for one row
already read (`holds`), so a page, a serializer and the sweep cannot disagree.

Every change of a row's ``state``, its attempt counter or its claim is one named function
here (the state table in docs/architecture.md lists them with their rules and callers);
no other module writes those columns, which `tests/test_row_owner.py` checks by reading
the code. A run's ``cleanup_status`` has its own owner, `cleanup.sweep.statuses`.

Locks are taken in one order, runs, then health rows, then ledger rows (`LOCK_ORDER`):
every writer goes through `taking`, which refuses a lock taken out of that order.
May import: the models, conf, `sql`, `clock`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import Exists, Expression, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Now

from . import clock
from .conf import claim_timeout_s, setting
from .models import (
    LEASE_KIND,
    STEP_KIND,
    TERMINAL,
    UNRESOLVED,
    Attempt,
    AttemptOutcome,
    LogKind,
    Resource,
    ResourceState,
    Run,
    RunLog,
    RunStatus,
    Step,
)
from .sql import SPECIAL, Statement, column_of, execute_prepared, fetch_prepared, field_of, shared_values

# -- the states, as sets ------------------------------------------------------------------

# States the automatic sweep claims a row from (a `reverting` row only once its claim expired).
SWEPT_STATES = (ResourceState.LIVE, ResourceState.FAILED)
# States a person acts on (waive, reset): what is unresolved and not held by a live claim.
PERSON_STATES = (ResourceState.LIVE, ResourceState.FAILED, ResourceState.DRIFTED)
# Rows that may still owe the world something the sweep will try: the finder's index.
OWING_STATES = (ResourceState.LIVE, ResourceState.FAILED, ResourceState.REVERTING)

# A failed row waits at most this long before its next attempt (rule 5).
LONGEST_BACKOFF = timedelta(days=30)
# A dead sweeper's claim released at the ceiling (rule 20).
DEAD_CLAIM = "the sweeper that claimed this stopped before it had an answer"


# -- predicates ---------------------------------------------------------------------------
# Each answers a `Q` on the resource table. ``now`` is the database's clock when it is None
# (`cleanup.clock`: the statement reads the time itself, so no worker's clock decides who
# may act on a row, rule 9); a time in hand (a page's, a test's, or the future moment a
# wake-up asks about) may be given instead. ``max_attempts`` is the caller's
# (`conf.max_revert_attempts()`), so a statement compiled once binds it later.

# A time a predicate compares with: one in hand, or an expression of the database's clock.
When = dt.datetime | Expression


def _at(now: When | None) -> When:
    return clock.at() if now is None else now


def claim_expired(now: When | None = None) -> Q:
    """The row's claim ran out: its sweeper died, or stopped, holding it."""
    return Q(claim_expires_at__lt=_at(now))


def claim_live(now: When | None = None) -> Q:
    """The row's claim still holds: a sweeper works it, or a call past its budget still runs (rule 18)."""
    return Q(claim_expires_at__gte=_at(now))


def unclaimed(now: When | None = None) -> Q:
    """No claim holds the row: never claimed, let go, or run out."""
    return Q(claim_expires_at__isnull=True) | claim_expired(now)


def swept() -> Q:
    """The row is the automatic sweep's to try, attempts aside: live or failed, and retryable."""
    return Q(state__in=SWEPT_STATES, retryable=True)


def attempts_left(max_attempts: int) -> Q:
    """The sweep will try the row again, now or after its backoff (rule 5)."""
    return swept() & Q(revert_attempts__lt=max_attempts)


def not_spent() -> Q:
    """Of a dead claim: its attempt was not spent by a call of its own. Its module was never
    called, or the call was marked with others of its wave and may never have started
    before another call of the wave took the process down (rule 20)."""
    return Q(claim_called=False) | Q(claim_shared=True)


def _takeover_goes_on(max_attempts: int) -> Q:
    """Of a ``reverting`` row whose claim ran out: the claim that takes it over will call
    again. It has attempts left, or its dead claim spent none (`not_spent`), whose attempt
    that claim gives back (rules 5 and 20)."""
    return Q(revert_attempts__lt=max_attempts) | (not_spent() & Q(revert_attempts__lte=max_attempts))


def claimable(now: When | None, max_attempts: int) -> Q:
    """The automatic sweep may claim the row now (rules 2, 5, 9, 20).

    Attempts left, its backoff passed, and no live claim (a failed row still claimed is
    held by a call past its budget, rule 18); or a ``reverting`` row whose claim ran out
    and whose takeover goes on (`_takeover_goes_on`).
    """
    fresh = (
        attempts_left(max_attempts)
        & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=_at(now)))
        & unclaimed(now)
    )
    abandoned = Q(state=ResourceState.REVERTING) & claim_expired(now) & _takeover_goes_on(max_attempts)
    return fresh | abandoned


def spent_dead_claim(now: When | None, max_attempts: int) -> Q:
    """A dead sweeper's claim with no attempt left, whose call started: the next pass
    releases it as ``failed`` (rule 20)."""
    return Q(
        state=ResourceState.REVERTING, claim_called=True, claim_shared=False, revert_attempts__gte=max_attempts
    ) & claim_expired(now)


def tried_again(now: When | None, max_attempts: int) -> Q:
    """Will the sweep still try this row (when its run cleans up by itself)?

    A row with attempts left; and a row being given back (``reverting``) while its claim
    holds, or, once its claim ran out, while its takeover goes on. A ``reverting`` row at
    the ceiling whose dead claim had called is not tried again: it is released as
    ``failed`` (rule 20) and waits for a person. What the admin's counts, the API's
    ``retryable`` and ``next_attempt_at`` say.
    """
    in_hand = Q(state=ResourceState.REVERTING) & (claim_live(now) | _takeover_goes_on(max_attempts))
    return attempts_left(max_attempts) | in_hand


def keeps_run_pending(max_attempts: int) -> Q:
    """A run in the automatic sweep stays ``pending`` while it has such a row: attempts
    left, or held by a claim, live or dead, whose verdict or release is still to come (rule 5)."""
    return attempts_left(max_attempts) | Q(state=ResourceState.REVERTING)


def owing() -> Q:
    """What the finder's index (``finder_owing_run_idx``) holds: rows the sweep may still owe a call."""
    return Q(state__in=OWING_STATES, retryable=True)


def suspect() -> Q:
    """A row taken over from a sweeper that died in its call after an earlier attempt, or
    in a wave of calls (maybe its own call took the wave down, maybe another's): its group
    is worked alone, where its own call spends its attempt (rule 20)."""
    return Q(state=ResourceState.REVERTING, claim_called=True) & (Q(revert_attempts__gte=2) | Q(claim_shared=True))


def lone_suspect() -> Q:
    """A suspect row whose dead claim was its group's alone, or that was taken over with
    other suspects and died again: maybe its own call took the process down, so its group
    is worked alone, one at a time, where its own call spends its attempt (rule 20). The
    other suspects (their dead claim marked with a wave) are taken over together."""
    return suspect() & (Q(claim_shared=False) | Q(claim_suspect=True))


def backing_off(now: When | None, max_attempts: int) -> Q:
    """The sweep will try the row again, but not before its backoff has passed."""
    return attempts_left(max_attempts) & Q(next_attempt_at__gt=_at(now))


def in_automatic_sweep() -> Q:
    """The row's run has ended and cleans up by itself (not left to a person, rule 7)."""
    return Q(run__status__in=TERMINAL, run__auto_cleanup=True)


def awaits_sweep(max_attempts: int) -> Q:
    """The sweep will come to the row by itself: attempts left and its run in the automatic
    sweep. Such a row, of a backend that is down, waits for its backend (rule 21)."""
    return attempts_left(max_attempts) & in_automatic_sweep()


def person_may_act(now: When | None = None) -> Q:
    """A person may waive or reset the row: unresolved and not held by a live claim (rules 6, 12)."""
    return Q(state__in=PERSON_STATES) | (Q(state=ResourceState.REVERTING) & claim_expired(now))


def held_by(token: uuid.UUID | str) -> Q:
    """The rows a claim still holds: a verdict lands only on these (rule 9)."""
    return Q(state=ResourceState.REVERTING, claim_token=token)


def claimed_by_another(token: uuid.UUID | str, now: When | None = None) -> Q:
    """A row another claim than ``token`` holds now: its sweeper is giving it back."""
    return Q(state=ResourceState.REVERTING) & claim_live(now) & ~Q(claim_token=token)


def held_past_budget(now: When | None = None) -> Q:
    """A failed row whose claim still holds: its call outlived its budget and may still act (rule 18)."""
    return Q(state=ResourceState.FAILED) & claim_live(now)


def _run_cleans_up_by_itself(flag: bool) -> Exists:
    # The run's flag read by its primary key for each row (an EXISTS), never by joining runs.
    return Exists(Run.objects.filter(pk=OuterRef("run_id"), auto_cleanup=flag))


def retrying(now: When | None, max_attempts: int) -> Q:
    """Unresolved rows of ended runs the automatic sweep will still try."""
    return Q(_run_cleans_up_by_itself(True)) & tried_again(now, max_attempts)


def waiting_for_person(now: When | None, max_attempts: int) -> Q:
    """Unresolved rows of ended runs the sweep will not try again: a person retries or waives them.

    Exactly what `retrying` leaves out, written without negating the run's flag: a run left
    to a person is found through the partial index of such runs (they are few).
    """
    return Q(_run_cleans_up_by_itself(False)) | ~tried_again(now, max_attempts)


def gave_up(now: When | None, max_attempts: int) -> Q:
    """Unresolved rows of ended runs in the automatic sweep that it will not try again (at
    the ceiling, not retryable, drifted): the cleanup gave up on them, a person decides."""
    return Q(_run_cleans_up_by_itself(True)) & ~tried_again(now, max_attempts)


def left_for_later() -> Q:
    """Rows of runs a person ended out of the automatic sweep (rule 7): kept on purpose,
    never tried, so not given up; a person's cleanup gives them back."""
    return Q(_run_cleans_up_by_itself(False))


def run_waiting(run_id: int) -> QuerySet[Resource]:
    """One ended run's rows that wait (`ended_unresolved`): what its page, its alert and its
    steps count, so that they say the number the index and the ledger's filters say."""
    return ended_unresolved(Resource.objects.filter(run_id=run_id))


def counted_unresolved(rows: QuerySet[Resource] | None = None) -> QuerySet[Resource]:
    """Unresolved rows as every count of them reads them, a running run's or an ended one's:
    a step's placeholder only when nothing else of its step is left
    (`ResourceQuerySet.without_covered_placeholders`), never as one more row beside the
    resources it stands for. A run's page, the list of runs, the index, the ledger's filters
    and an alert all count through it, so none says 4 where another says 3."""
    rows = Resource.objects.all() if rows is None else rows
    unresolved: Any = rows.filter(state__in=UNRESOLVED)
    covered: QuerySet[Resource] = unresolved.without_covered_placeholders()
    return covered


def ended_unresolved(rows: QuerySet[Resource] | None = None) -> QuerySet[Resource]:
    """The unresolved rows of ended runs that a person acts on (`counted_unresolved`).

    The counts of the admin, its lists and the metrics read it, so a count and its list agree.
    """
    rows = Resource.objects.all() if rows is None else rows
    # "Not of a running run" rather than a join with the ended ones: read beside the few
    # running runs' partial index, not beside every run the retention window keeps.
    running = Run.objects.filter(pk=OuterRef("run_id"), status=RunStatus.RUNNING)
    return counted_unresolved(rows.exclude(Exists(running)))


# -- a predicate of one row already read ----------------------------------------------------

_LOOKUPS = frozenset({"exact", "in", "lt", "lte", "gt", "gte", "isnull"})


def holds(row: Any, condition: Q, now: dt.datetime | None = None) -> bool:
    """Does ``row`` (a `Resource`, its run selected with it where the `Q` reads the run)
    match ``condition``? The same answer the database gives, from the values in hand.

    A predicate on the database's clock (``now`` left None) needs the time in hand: ``now``,
    read from the database (`clock.now`) where the answer decides anything."""
    results = (_child(row, child, now) for child in condition.children)
    matched = all(results) if condition.connector == Q.AND else any(results)
    return not matched if condition.negated else matched


def _child(row: Any, child: Any, now: dt.datetime | None) -> bool:
    if isinstance(child, Q):
        return holds(row, child, now)
    if not isinstance(child, tuple):
        raise TypeError(f"holds() reads field lookups only, not {child!r}")
    path, expected = child
    if isinstance(expected, Now):
        if now is None:
            raise TypeError("holds() needs the time in hand for a predicate on the database's clock")
        expected = now
    parts = path.split("__")
    lookup = parts.pop() if parts[-1] in _LOOKUPS and len(parts) > 1 else "exact"
    value = row
    for part in parts:
        value = getattr(value, part)
    return _compare(value, lookup, expected)


def _compare(value: Any, lookup: str, expected: Any) -> bool:
    if lookup == "isnull":
        return (value is None) == bool(expected)
    if value is None:
        return False  # SQL: a comparison with NULL is not true
    if lookup == "exact":
        return bool(value == expected)
    if lookup == "in":
        return value in expected
    if lookup == "lt":
        return bool(value < expected)
    if lookup == "lte":
        return bool(value <= expected)
    if lookup == "gt":
        return bool(value > expected)
    return bool(value >= expected)


def attempts_left_of(row: Any, max_attempts: int) -> int:
    """How many automatic attempts the row has left: none once it is not the sweep's."""
    if not holds(row, swept()):
        return 0
    return max(0, max_attempts - int(row.revert_attempts))


def backoff(attempts: int, max_attempts: int) -> timedelta | None:
    """How long after its failure a row that failed at attempt ``attempts`` is tried again:
    a backoff that doubles with each attempt (rule 5); never once it has no attempt left (a
    person's retry clears it). Counted from the verdict's write, on the database's clock."""
    if attempts >= max_attempts:
        return None
    seconds = setting("EVENT_REVERT_BACKOFF_S") * 2 ** max(0, attempts - 1)
    return min(timedelta(seconds=seconds), LONGEST_BACKOFF)


# -- a row's history -------------------------------------------------------------------------


def history(row: Any, stored: Sequence[Attempt], logs: Iterable[RunLog] | None = None) -> list[Attempt]:
    """Every attempt on ``row``, newest first, as staff read it: the attempts recorded, and the
    one that gave the row back.

    A row given back by the sweep has no attempt of its own recorded (a batch of thousands of
    rows would write as many again): the row itself says it, ``reverted`` with its attempt's
    number and time, and its pass's ``cleanup.swept`` entry, written with it or just after,
    says by whom. ``stored`` are the row's recorded attempts, newest first; ``logs`` its run's
    ``cleanup.swept`` entries (read from the database when None). The attempt made here is
    not saved.
    """
    attempts = list(stored)
    if row.state != ResourceState.REVERTED or row.resolved_at is None:
        return attempts
    if any(a.outcome == "done" and a.number == row.revert_attempts for a in attempts):
        return attempts  # recorded (a lease's hand-down, or a give-back recorded before)
    if logs is None:
        logs = RunLog.objects.filter(run_id=row.run_id, kind=LogKind.CLEANUP_SWEPT, at__gte=row.resolved_at)
    after = [e for e in logs if e.kind == LogKind.CLEANUP_SWEPT and e.at >= row.resolved_at]
    swept = min(after, key=_when, default=None)
    by = str(swept.detail.get("by") or "") if swept is not None and isinstance(swept.detail, dict) else ""
    given_back = Attempt(
        resource_id=row.pk,
        run_id=row.run_id,
        number=row.revert_attempts,
        at=row.resolved_at,
        outcome="done",
        error="",
        by=by,
    )
    return sorted([given_back, *attempts], key=lambda a: (a.at, a.pk is None, a.pk or 0), reverse=True)


def _when(entry: RunLog) -> tuple[dt.datetime, int]:
    return entry.at, entry.pk or 0


# -- leases on one target (rule 13) ---------------------------------------------------------


def lease_confirmed(row: Any) -> bool:
    """Did the lease's ``apply`` answer success? Rows that do not say were applied."""
    return not (isinstance(row.payload, dict) and row.payload.get("confirmed") is False)


def heir(row: Any, open_rows: Iterable[Any]) -> Any | None:
    """The lease ``row`` hands its baseline down to, of the other unresolved leases on its
    target (oldest first): the next newer one whose apply was confirmed (rule 13). The pass
    hands down to it (`cleanup.sweep.leases`) and the plan names it (`cleanup.plan`)."""
    return next((other for other in open_rows if other.pk > row.pk and lease_confirmed(other)), None)


# -- the lock order -------------------------------------------------------------------------

RUNS, HEALTH, LEDGER = "runs", "health rows", "ledger rows"
# Every transaction that locks more than one of these takes them in this order, so two
# writers never wait on each other in a circle: a verdict (runs, the blamed backends'
# health, its rows), a claim (runs, rows), a mark-down (health, the rows it forgives).
LOCK_ORDER = (RUNS, HEALTH, LEDGER)


class LockOrderBroken(RuntimeError):
    """A writer locked an earlier kind of row after a later one (`LOCK_ORDER`)."""


def taking(kind: str) -> None:
    """Say that the caller's transaction is about to lock rows of ``kind``; refuses it
    after a lock that comes later in `LOCK_ORDER` in the same transaction. Outside a
    transaction each statement is its own and nothing is remembered.

    A transaction is known by its outermost atomic block, its locks held until it ends.
    The block a test case wraps each test in is not one: the code under test runs as it
    would on its own.
    """
    blocks = [block for block in connection.atomic_blocks if not getattr(block, "_from_testcase", False)]
    if not blocks:
        return
    level, outer = LOCK_ORDER.index(kind), blocks[0]
    held = getattr(connection, "_cleanup_locks", None)
    if held is not None and held[0] is outer:
        if level < held[1]:
            raise LockOrderBroken(
                f"{kind} locked after {LOCK_ORDER[held[1]]}: the order is {', then '.join(LOCK_ORDER)}"
            )
        level = max(level, held[1])
    cast(Any, connection)._cleanup_locks = (outer, level)


def lock(rows: QuerySet[Resource]) -> QuerySet[Resource]:
    """``rows`` locked for the caller's transaction, in the lock order."""
    taking(LEDGER)
    return rows.select_for_update()


# -- transitions: new rows ----------------------------------------------------------------


def reserve_placeholder(step: Step, module: str) -> Resource:
    """The write-ahead row of one step (kind ``step``), ``live``, once per step however
    often it runs: it holds the run until the step records what it made (rule 16)."""
    placeholder, _ = Resource.objects.get_or_create(
        step=step,
        kind=STEP_KIND,
        defaults={
            "run_id": step.run_id,
            "module": module,
            "backend": step.backend,
            "ref": step.idempotency_key,
            "action": step.action_id,
            "state": ResourceState.LIVE,
        },
    )
    return placeholder


def record(new: Sequence[Resource]) -> list[Resource]:
    """What a step reports it made: new ``live`` rows, in one insert (rule 1)."""
    for row in new:
        row.state = ResourceState.LIVE
    return Resource.objects.bulk_create(new)


def reserve(**fields: Any) -> Resource:
    """A lease recorded before it is applied: ``live``, its apply not yet confirmed (rule 13)."""
    payload = {**fields.pop("payload", {}), "confirmed": False}
    return Resource.objects.create(state=ResourceState.LIVE, payload=payload, **fields)


def confirm(pk: int) -> None:
    """The lease's apply answered success. Under a lock: a hand-down may be rewriting the
    row's baseline at the same moment, and neither change may lose the other."""
    with transaction.atomic():
        locked = lock(Resource.objects.filter(pk=pk)).get()
        payload = dict(locked.payload or {})
        payload["confirmed"] = True
        Resource.objects.filter(pk=pk).update(payload=payload)


def resurrect(row: Resource) -> Resource:
    """Rule 14: record again, ``live``, what a rolled-back backend brought back. One
    resurrection per row: a second raises ``IntegrityError``."""
    return Resource.objects.create(
        run_id=row.run_id,
        step_id=row.step_id,
        module=row.module,
        backend=row.backend,
        kind=row.kind,
        ref=row.ref,
        member_key=row.member_key,
        action=row.action,
        payload=row.payload,
        state=ResourceState.LIVE,
        resurrected_from=row,
    )


# -- transitions: the sweep ---------------------------------------------------------------

# What a claim adds to a row's attempts: one, less the dead claim's own when it never
# called or was marked with others of its wave (SET reads the row as it was; rule 20).
_SPENT = f"CASE WHEN state = '{ResourceState.REVERTING.value}' AND (NOT claim_called OR claim_shared) THEN 0 ELSE 1 END"
# What a claim answers of each row it took.
CLAIMED_COLUMNS = (
    "id",
    "run_id",
    "step_id",
    "kind",
    "ref",
    "payload",
    "member_key",
    "revert_attempts",
    "action",
    "backend",
)


def claiming(
    where: str, where_params: Sequence[Any], token: uuid.UUID, called_together: str, suspects: str = "FALSE"
) -> Statement:
    """The claim (rule 9), as a statement (SQL, params) that the pass sends as a part of its
    claim (`cleanup.sweep.statements.claim`, which chooses the groups in the same statement):
    the rows ``where`` selects become ``reverting``, stamped with ``token`` and an expiry on
    the database's clock (`cleanup.clock`), one attempt counted (rule 5); it answers
    `CLAIMED_COLUMNS` of each row taken.

    Taking over an abandoned claim counts another attempt and keeps the one the dead
    sweeper spent if its call had started; a claim that died before its call gives its
    attempt back. The caller locks the rows' runs first and says so (`taking`, `LOCK_ORDER`).

    ``called_together`` (SQL, a boolean in the caller's statement): the claim takes several
    groups, whose calls start in waves; it marks them called together at once (`mark_called`
    with ``shared``), so no wave needs a statement of its own. A sweeper that dies holding
    them has spent none of their attempts (any of its calls may not have started), and each
    group is next called alone (rule 20).

    ``suspects`` (SQL, a boolean): the claim takes a dead sweeper's suspects over together;
    if it dies too, each of them is next taken over alone (`lone_suspect`).
    """
    meta = Resource._meta
    values: dict[str, Any] = {"state": ResourceState.REVERTING.value, "claim_token": token}
    quote = connection.ops.quote_name
    names = (*values, "claim_expires_at", "updated_at", "claim_called", "claim_shared", "claim_suspect")
    fields = {name: field_of(Resource, name) for name in names}
    sets = [f"{quote(column_of(fields[n]))} = %s" for n in values]
    params = [fields[n].get_db_prep_save(v, connection) for n, v in values.items()]
    sets += [
        f"{quote(column_of(fields['claim_expires_at']))} = {clock.sql_after()}",
        f"{quote(column_of(fields['updated_at']))} = {clock.SQL}",
    ]
    params.append(float(claim_timeout_s()))
    sets += [f"{quote(column_of(fields[name]))} = {called_together}" for name in ("claim_called", "claim_shared")]
    sets.append(f"{quote(column_of(fields['claim_suspect']))} = {suspects}")
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)}, revert_attempts = revert_attempts + {_SPENT} "
        f"WHERE {where} RETURNING {', '.join(quote(c) for c in CLAIMED_COLUMNS)}"
    )
    return sql, [*params, *where_params]


def mark_called(where: str, params: Sequence[Any], shared: bool = False) -> int:
    """Just before their call: the rows ``where`` selects (held by their claim) were called
    under it, so the attempt is spent (rule 5). One UPDATE in autocommit, so that a sweeper
    killed in the call has spent it.

    ``shared``: the calls of several groups start together. When their sweeper dies, a call
    of the wave may not have started before another took the process down, so a takeover
    gives the attempt back and the group is next called alone (rule 20).

    Its commit does not wait for the WAL to reach the disk (it is visible to every other
    sweeper at once, which is what a takeover reads): a wave costs half as much, and only
    a crash of the database server itself in the next moment could lose a mark, whose
    attempt would then be given back once.
    """
    taking(LEDGER)
    table = connection.ops.quote_name(Resource._meta.db_table)
    return execute_prepared(
        f"UPDATE {table} SET claim_called = %s, claim_shared = %s WHERE {where} "
        "AND set_config('synchronous_commit', 'off', true) IS NOT NULL",
        [True, shared, *params],
    )


class _Derived:
    """A column's new value that the write derives from the row as it was, by name."""

    def __init__(self, name: str, sql: str) -> None:
        self.name = name
        self.sql = sql

    def __repr__(self) -> str:
        return self.name


# The state before the claim: a row never tried goes back to live, one that failed before
# stays failed.
PREVIOUS_STATE = _Derived(
    "PREVIOUS_STATE",
    f"CASE WHEN r.last_error = '' THEN '{ResourceState.LIVE.value}' ELSE '{ResourceState.FAILED.value}' END",
)
# The claim's attempt is given back: the row's counter goes down by one.
ATTEMPT_GIVEN_BACK = _Derived("ATTEMPT_GIVEN_BACK", "r.revert_attempts - 1")
_DERIVED = {"state": PREVIOUS_STATE, "revert_attempts": ATTEMPT_GIVEN_BACK}

# A transition's columns, staged by the pass and written by `write_verdicts`. Its times
# (`VERDICT_TIMES`) are delays after the write, on the database's clock: a timedelta, or
# None for no time at all.
Verdict = dict[str, Any]
_LET_GO: Verdict = {"claim_token": None, "claim_expires_at": None}
AT_WRITE = timedelta(0)  # the moment the verdict is written


def _claim_after(keep_for: timedelta | None) -> Verdict:
    """A claim let go, or, while the call still runs past its budget, kept for ``keep_for``
    after the write (rule 18)."""
    return _LET_GO if keep_for is None else {"claim_expires_at": keep_for}


def given_back() -> Verdict:
    """The module gave the row back: ``reverted``, resolved (rule 4)."""
    return {"state": ResourceState.REVERTED, "last_error": "", "resolved_at": AT_WRITE, **_LET_GO}


def fail(error: str, attempts: int, max_attempts: int, keep_for: timedelta | None = None) -> Verdict:
    """A retryable failure: ``failed``, tried again after its backoff while it has attempts
    left (rule 5)."""
    return {
        "state": ResourceState.FAILED,
        "last_error": error,
        "next_attempt_at": backoff(attempts, max_attempts),
        **_claim_after(keep_for),
    }


def fail_for_good(error: str) -> Verdict:
    """A terminal answer (no module, ``retry: false``): ``failed``, tried again only by a person (rule 4)."""
    return {"state": ResourceState.FAILED, "last_error": error, "retryable": False, **_LET_GO}


def drift(error: str) -> Verdict:
    """Someone else's value is in place: ``drifted``, left to a person (rule 4)."""
    return {"state": ResourceState.DRIFTED, "last_error": error, **_LET_GO}


def wait(error: str, waits: timedelta, keep_for: timedelta | None = None) -> Verdict:
    """The answer blamed a backend that is down: the attempt is given back and the row
    waits for the backend, ``failed`` until its next probe, ``waits`` after the write (rule 21)."""
    return {
        "state": ResourceState.FAILED,
        "revert_attempts": ATTEMPT_GIVEN_BACK,
        "last_error": error,
        "next_attempt_at": waits,
        **_claim_after(keep_for),
    }


def give_back_claim() -> Verdict:
    """The pass ran out of time before the call: the claim and its attempt are given back,
    and the row returns to the state it was in (rule 26)."""
    return {"state": PREVIOUS_STATE, "revert_attempts": ATTEMPT_GIVEN_BACK, **_LET_GO}


# An attempt of a row's history, as `write_verdicts` records it: the row's id, its run's id,
# the attempt's number, its outcome and its error.
AttemptRecord = tuple[int, int, int, str, str]


# The columns a verdict may write (the transitions above): fixed, so that every batch's
# verdicts are written by one and the same statement, prepared once (`write_verdicts`).
VERDICT_COLUMNS = (
    "state",
    "last_error",
    "resolved_at",
    "next_attempt_at",
    "retryable",
    "revert_attempts",
    "claim_token",
    "claim_expires_at",
)
# A verdict's times: delays after its write, on the database's clock (`Verdict`).
VERDICT_TIMES = ("resolved_at", "next_attempt_at", "claim_expires_at")


def write_verdicts(
    token: uuid.UUID,
    by_step: Mapping[int, Verdict],
    by_row: Mapping[int, Verdict],
    attempts: Sequence[AttemptRecord] = (),
    by: str = "",
) -> set[int]:
    """Write staged verdicts on the rows ``token`` still holds (rule 9), and the ``attempts``
    of those rows, in one statement; answers the ids of the rows written.

    Each distinct verdict travels once (`sql.shared_values`): a row or a step names it by
    its number. One UPDATE for a step's rows but its leases that all take the same
    verdict (``by_step``), one for single rows (``by_row``); the attempts are inserted only
    for rows those UPDATEs wrote, so a claim taken over records nothing. Whatever the
    batch's outcomes, the statement is the same. The caller locked the rows' runs first
    (`LOCK_ORDER`); the UPDATEs lock the rows.
    """
    if not by_step and not by_row:
        return set()
    taking(LEDGER)
    verdicts: list[Verdict] = []
    numbers: dict[int, int] = {}  # a verdict's id() -> its number
    by_value: dict[tuple[Any, ...], int] = {}

    def number(verdict: Verdict) -> int:
        """The verdict's number, from 1: the same object, or equal values, the same number."""
        found = numbers.get(id(verdict))
        if found is None:
            key: tuple[Any, ...] = tuple(sorted(verdict.items()))
            try:
                found = by_value.get(key)
            except TypeError:  # a value that cannot be a key: a verdict of its own
                key = (id(verdict),)
            if found is None:
                verdicts.append(verdict)
                found = by_value[key] = len(verdicts)
            numbers[id(verdict)] = found
        return found

    keyed = [(list(changed), [number(v) for v in changed.values()]) for changed in (by_step, by_row)]
    names = [*VERDICT_COLUMNS, *sorted({c for v in verdicts for c in v} - set(VERDICT_COLUMNS))]
    marked = [{c: SPECIAL if isinstance(v, _Derived) else v for c, v in verdict.items()} for verdict in verdicts]
    shared_sql, shared_params, sets = shared_values(
        Resource,
        marked,
        names,
        {column: derived.sql for column, derived in _DERIVED.items()},
        offsets=dict.fromkeys(VERDICT_TIMES, clock.SQL),
    )
    quote = connection.ops.quote_name
    table = quote(Resource._meta.db_table)
    updated = quote(column_of(field_of(Resource, "updated_at")))
    token_param = field_of(Resource, "claim_token").get_db_prep_save(token, connection)
    # The state is a parameter, not a literal: the partial index of rows being reverted
    # would then look cheaper to the one plan than reaching the rows by their steps, and
    # match every row it reads against every step of the batch (20 rows a step: 50,000
    # comparisons a batch). The keys are materialized, so a plan that reads them again
    # for each row reads two columns, not the arrays.
    held = "r.claim_token = %s AND r.state = %s"
    parts, params = [], list(shared_params)
    for i, (column, fence) in enumerate((("step_id", f" AND NOT (r.kind = '{LEASE_KIND}')"), ("id", ""))):
        parts.append(
            f"k{i} AS MATERIALIZED (SELECT * FROM unnest(%s::bigint[], %s::integer[]) AS k(id, n)), "
            f"w{i} AS (UPDATE {table} AS r SET {', '.join(sets)}, {updated} = {clock.SQL} "
            f"FROM k{i} AS k, d "
            f"WHERE r.{quote(column)} = k.id AND {held}{fence} RETURNING r.id)"
        )
        params += [*keyed[i], token_param, ResourceState.REVERTING.value]
    written = "SELECT id FROM w0 UNION ALL SELECT id FROM w1"
    recording, recording_params = _recording(attempts, by, written)
    sql = f"WITH d AS ({shared_sql}), {', '.join(parts)}, w2 AS ({recording}) {written}"
    return {pk for (pk,) in fetch_prepared(sql, [*params, *recording_params])}


def _recording(attempts: Sequence[AttemptRecord], by: str, written: str) -> Statement:
    """The INSERT of ``attempts`` into the attempt history, for the rows ``written`` selects."""
    meta, quote = Attempt._meta, connection.ops.quote_name
    names = ("resource", "run", "number", "outcome", "error")
    types = [f"{field_of(Attempt, name).db_type(connection)}[]" for name in names]
    columns = ", ".join(quote(column_of(field_of(Attempt, name))) for name in (*names, "at", "by"))
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({columns}) "
        f"SELECT a.*, {clock.SQL}, %s FROM unnest({', '.join(f'%s::{t}' for t in types)}) "
        f"AS a(resource_id, run_id, number, outcome, error) WHERE a.resource_id IN ({written})"
    )
    arrays = [list(values) for values in zip(*attempts, strict=True)] or [[] for _ in names]
    return sql, [by or "", *arrays]


def release_spent_claims(max_attempts: int) -> list[Resource]:
    """Rule 20: dead claims at the ceiling whose call started become ``failed``, with the
    reason; answers the rows released (their ``id``, ``run_id``, ``kind``, ``ref``,
    ``revert_attempts``). The caller's transaction locked their runs first."""
    spent = lock(Resource.objects.filter(spent_dead_claim(None, max_attempts)))
    rows = list(spent.order_by("id").only("id", "run_id", "kind", "ref", "revert_attempts"))
    Resource.objects.filter(pk__in=[r.pk for r in rows]).update(
        state=ResourceState.FAILED, last_error=DEAD_CLAIM, updated_at=clock.at(), **_LET_GO
    )
    return rows


def runs_with_spent_claims(max_attempts: int) -> set[int]:
    """The runs of the rows `release_spent_claims` would release now (to lock them first)."""
    return set(Resource.objects.filter(spent_dead_claim(None, max_attempts)).values_list("run_id", flat=True))


def keep_claims(condition: Q, keep_for: timedelta) -> int:
    """Calls still running past their budget: their rows stay claimed for ``keep_for`` more,
    on the database's clock (rule 18)."""
    taking(LEDGER)
    return Resource.objects.filter(condition, state=ResourceState.FAILED).update(claim_expires_at=clock.after(keep_for))


def let_go_claims(condition: Q) -> int:
    """Calls past their budget that ended: their rows' claims are let go (rule 18)."""
    taking(LEDGER)
    return Resource.objects.filter(condition, state=ResourceState.FAILED).update(**_LET_GO)


def hand_down(token: uuid.UUID, pk: int) -> bool:
    """A lease that handed its baseline down is ``reverted``, if its claim still holds it
    (rule 13); answers whether it did."""
    return bool(
        lock(Resource.objects.filter(held_by(token), pk=pk)).update(
            state=ResourceState.REVERTED, last_error="", resolved_at=clock.at(), updated_at=clock.at(), **_LET_GO
        )
    )


def orphan_lease(row: Resource, reason: str, now: dt.datetime) -> bool:
    """A lease whose backend forgot it (its baseline is in force again) is ``orphaned``
    (rule 14), unless it moved since it was read; answers whether it was."""
    taking(LEDGER)
    return bool(
        Resource.objects.filter(pk=row.pk, state=row.state).update(
            state=ResourceState.ORPHANED,
            last_error=reason,
            next_attempt_at=None,
            resolved_at=now,
            updated_at=now,
            **_LET_GO,
        )
    )


# -- transitions: outages -------------------------------------------------------------------


def forgive(chosen: Q, spent: Subquery) -> int:
    """Rule 21: the rows ``chosen`` selects that the sweep still works get back the attempts
    ``spent`` (a subquery per row) that answers blaming their backend cost them, and are
    due at once. A row held by a sweeper right now counts too: its verdict gives back only
    the attempt of its own claim."""
    taking(LEDGER)
    open_rows = Q(state__in=OWING_STATES, retryable=True, revert_attempts__gt=0)
    return Resource.objects.filter(chosen & open_rows).update(
        revert_attempts=F("revert_attempts") - spent, next_attempt_at=None
    )


def defer(waiting: QuerySet[Resource], until: dt.datetime | None) -> int:
    """Rule 21: the ``waiting`` rows of a backend that is down leave the sweep until
    ``until`` (its next probe, a time on the database's clock), unless their own backoff
    ends later: the finder and the claim pass over them meanwhile."""
    taking(LEDGER)
    return waiting.filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=until)).update(next_attempt_at=until)


def resume_at(waiting: QuerySet[Resource], at: dt.datetime, deferred_until: dt.datetime | None = None) -> int:
    """Rule 21: a backend is up again, and its ``waiting`` rows are due at ``at`` (a bucket of
    the spread, on the database's clock). A row whose own backoff ends later keeps it; a
    row the outage deferred to its probe due at ``deferred_until``, or before, does not
    wait for that probe any more."""
    taking(LEDGER)
    due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=at)
    if deferred_until is not None:
        due |= Q(next_attempt_at__lte=deferred_until)
    return waiting.filter(due).update(next_attempt_at=at)


def give_up(rows: QuerySet[Resource], reason: str, now: dt.datetime) -> int:
    """Rule 23: waiting rows of an outage past its bound fail for good, with the reason."""
    taking(LEDGER)
    return Resource.objects.filter(pk__in=rows.filter(swept()).values("pk")).update(
        state=ResourceState.FAILED, retryable=False, last_error=reason, next_attempt_at=None, updated_at=now
    )


def hurry(rows: QuerySet[Resource], max_attempts: int) -> int:
    """A person's "now": rows waiting out a backoff are claimable at once; their counters stay."""
    taking(LEDGER)
    return rows.filter(backing_off(None, max_attempts)).update(next_attempt_at=None, updated_at=clock.at())


# -- transitions: people and reconcile ------------------------------------------------------


def _resolve_logged(
    rows: QuerySet[Resource],
    condition: Q,
    state: str,
    error: str | None,
    log_kind: str,
    also: Mapping[str, Any] | None = None,
    **detail: Any,
) -> list[Resource]:
    """Resolve the rows of ``rows`` still matching ``condition`` as ``state``, and log each.

    The rows are locked first, so the log names exactly the rows that changed (one a
    sweeper claimed meanwhile no longer matches). Answers the rows resolved. An ``error``
    of None keeps each row's last error; ``also`` sets more fields.
    """
    now = clock.now()
    fields = {} if error is None else {"last_error": error}
    with transaction.atomic():
        locked = list(lock(rows.filter(condition)).order_by("id"))
        Resource.objects.filter(pk__in=[r.pk for r in locked]).update(
            state=state, resolved_at=now, updated_at=now, **_LET_GO, **fields, **(also or {})
        )
        RunLog.objects.bulk_create(
            RunLog(
                run_id=row.run_id,
                kind=log_kind,
                at=now,
                detail={**detail, "resource": f"{row.kind}:{row.ref}", "resource_id": row.pk},
            )
            for row in locked
        )
    return locked


def orphan(rows: QuerySet[Resource], reason: str, **detail: Any) -> list[Resource]:
    """Rule 10: rows the module says are no longer in the world are ``orphaned``, each
    logged; a row the sweep claimed meanwhile is not live any more and stays as it is."""
    return _resolve_logged(
        rows, Q(state=ResourceState.LIVE), ResourceState.ORPHANED, reason, LogKind.RESOURCE_ORPHANED, **detail
    )


def orphan_failed(rows: QuerySet[Resource], reason: str, **detail: Any) -> list[Resource]:
    """Rule 14: after a restart, ``failed`` rows the module says are no longer in the world
    are ``orphaned`` too, each logged; a row a live claim holds stays as it is."""
    condition = Q(state=ResourceState.FAILED) & unclaimed()
    return _resolve_logged(rows, condition, ResourceState.ORPHANED, reason, LogKind.RESOURCE_ORPHANED, **detail)


def waive(rows: QuerySet[Resource], reason: str, actor: str, now: dt.datetime, **detail: Any) -> list[Resource]:
    """Rule 12: a person resolves rows as ``waived``; each keeps its last error, with the
    reason, the person and the time beside it. A row a live claim holds is left alone."""
    also = {"waived_reason": reason, "waived_by": actor or "", "waived_at": now, "next_attempt_at": None}
    return _resolve_logged(
        rows,
        person_may_act(),
        ResourceState.WAIVED,
        None,
        LogKind.RESOURCE_WAIVED,
        also=also,
        reason=reason,
        by=actor,
        **detail,
    )


def reset_for_person(run_id: int, now: dt.datetime) -> int:
    """Rule 6: a person's cleanup puts the run's rows a person may act on back in the sweep:
    attempts to zero, retryable, no backoff, a drifted row ``live`` again. A row a sweeper
    holds right now is left to its verdict. Answers how many rows were reset, counted as
    every count of them is (`counted_unresolved`: a step's placeholder reset beside its
    resources is not one more), so the log and the person's message say what the page said.
    The caller locked the run first (`LOCK_ORDER`)."""
    rows = Resource.objects.filter(person_may_act(), run_id=run_id)
    ids = list(lock(rows).values_list("id", flat=True))
    Resource.objects.filter(pk__in=ids, state=ResourceState.DRIFTED).update(state=ResourceState.LIVE)
    reset = Resource.objects.filter(pk__in=ids)
    if not reset.update(revert_attempts=0, retryable=True, next_attempt_at=None, updated_at=now):
        return 0
    return counted_unresolved(reset).count()


# -- transitions: a backend's own dead-man's switch ---------------------------------------


def given_back_by_switch(
    rows: QuerySet[Resource], given_back: Iterable[str], kept: Mapping[str, str], reason: str, now: dt.datetime
) -> tuple[list[Resource], list[Resource]]:
    """Rule 34: the backend of ``rows`` gave back, by itself, the unresolved rows whose refs
    are in ``given_back``: they are ``reverted`` with ``reason``, never called again, each
    with an attempt in its history. A row in ``kept`` (the switch could not give it back)
    is ``failed`` with the switch's reason beside the reason ``kept`` gives; its attempts
    stay as they are. A step's placeholder resolves with the last of its step's rows the
    switch gave back. A claim held on a row is let go: a late sweeper cannot overwrite this.
    Answers ``(reverted, failed)``, the rows as they were."""
    given = set(given_back)
    open_rows = rows.filter(state__in=UNRESOLVED)
    with transaction.atomic():
        locked = list(lock(open_rows.filter(ref__in=given | set(kept))).exclude(kind=STEP_KIND).order_by("id"))
        back = [r for r in locked if r.ref in given]
        failed = [r for r in locked if r.ref not in given]
        steps = {r.step_id for r in back if r.step_id is not None}
        still_open = set(
            open_rows.filter(step_id__in=steps)
            .exclude(kind=STEP_KIND)
            .exclude(pk__in=[r.pk for r in back])
            .values_list("step_id", flat=True)
        )
        placeholders = list(lock(open_rows.filter(kind=STEP_KIND, step_id__in=steps - still_open)).order_by("id"))
        done = [*back, *placeholders]
        Resource.objects.filter(pk__in=[r.pk for r in done]).update(
            state=ResourceState.REVERTED,
            last_error=reason,
            next_attempt_at=None,
            resolved_at=now,
            updated_at=now,
            **_LET_GO,
        )
        for row in failed:
            Resource.objects.filter(pk=row.pk).update(
                state=ResourceState.FAILED, last_error=f"{reason}; kept: {kept[row.ref]}", updated_at=now, **_LET_GO
            )
        Attempt.record(back, AttemptOutcome.DONE, error=reason, by="backend switch", at=now)
        for row in failed:
            Attempt.record(
                [row], AttemptOutcome.FAILED, error=f"{reason}; kept: {kept[row.ref]}", by="backend switch", at=now
            )
    return done, failed
