"""Calling the modules for a claimed batch: the second stage of a pass, concurrently,
within limits, never twice at once.

Step groups and loose rows are given back by ``revert`` calls made concurrently, at most
``EVENT_CALL_CONCURRENCY`` at once and at most a module's ``max_concurrency`` for one
module, on reused workers (`cleanup.calls`; rule 19). Lease groups go one at a time, in the
order `claims.Batch.leases` gives, because the hand-downs of rule 13 (`leases`) read and
write the ledger between their calls. Each group gets one `Called`: its verdict, or None
when the pass's time ran out before its call could start.

A call that outlives its budget is not stopped (nothing can stop it) and not retried
while it runs: its verdict keeps the claim on its rows, and the keeper here renews that
claim while the call still runs in this process and lets it go once the call ends. If
the process dies the claim simply expires, as any dead sweeper's does.
May import: the models, conf, `cleanup.rows`, `logs`, `calls`, `registry`, `outages`, `leases`, `reconnect`.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Q
from django.utils import timezone

from .. import calls, outages, registry, rows
from ..calls import Outcome, Verdict
from ..conf import claim_timeout_s, setting
from ..logs import log_context
from ..models import LEASE_KIND, STEP_KIND, Resource
from .claims import Group, mark_called
from .leases import give_back_lease
from .reconnect import lost, retried

logger = logging.getLogger(__name__)


@dataclass
class Called:
    """What became of one group's call."""

    group: Group
    verdict: Verdict | None  # None: not started, the pass's time ran out first
    what: str | None = None
    handed_down: bool = False  # a lease that handed its baseline down; its row is resolved
    running: Future[Any] | None = None  # the call, when it outlived its budget and still runs
    blamed: str | None = None  # the answer blamed the module's backend (`cleanup.outages`)
    module: str | None = None  # the module called
    backend: str = ""  # the module's backend called
    waited: timedelta | None = None  # set when written: its module is down, the rows wait this long


@dataclass(eq=False)
class _Job:
    group: Group
    module: str
    backend: str
    limit: int
    fn: Callable[..., Any]
    kwargs: dict[str, Any]
    budget_ms: int
    what: str
    refs: list[str]
    paced: bool = False  # its action declares max_rate: it waits for its turn, and is marked alone


@dataclass(frozen=True)
class _Action:
    """What every revert call of one action shares, read once per `call_groups`: the
    action, its module, its limit in flight, its budget, whether it is paced."""

    action: Any
    module: str
    limit: int
    budget_ms: int
    paced: bool


def past(deadline: dt.datetime | None) -> bool:
    """Has a leg's time budget run out? (None: no budget.)"""
    return deadline is not None and timezone.now() >= deadline


def call_lease(group: Group, token: uuid.UUID, deadline: dt.datetime | None = None) -> Called:
    """Restore one lease group, or hand its baseline down (`leases`)."""
    if past(deadline):
        return Called(group, None)
    outcome = give_back_lease(group.run_id, group.rows[0], token)
    if not isinstance(outcome.verdict, Verdict):  # HANDED_DOWN
        return Called(group, None, outcome.what, handed_down=True)
    lease, _target = registry.lease_for_ref(group.rows[0].ref)
    return Called(
        group,
        outcome.verdict,
        outcome.what,
        running=outcome.running,
        blamed=outcome.blamed,
        module=getattr(lease, "module", None),
        backend=group.rows[0].backend,
    )


def call_groups(
    groups: Sequence[Group],
    deadline: dt.datetime | None = None,
    health: outages.Snapshot | None = None,
    token: uuid.UUID | None = None,
    *,
    answered: Callable[[list[Called]], object] | None = None,
    held_until: float | None = None,
) -> list[Called]:
    """Make the revert calls of step groups and loose rows; answers one `Called` per group.

    ``token`` is the claim's: each wave's rows are marked called just before its calls
    start. None when the claim marked them already (`claims.claim`, several groups).
    ``answered`` is told of the calls that answered as they answer, every
    `ANSWERS_EVERY_S`, so that their verdicts are written while other calls still run;
    what it was told of is not in the answer. ``held_until`` (monotonic) is when the claim
    runs out: a mark that lost its database is tried again until then.
    """
    results: list[Called] = []
    jobs: list[_Job] = []
    actions: dict[str, _Action | None] = {}
    for group in groups:
        prepared = _revert_job(group, actions)
        if isinstance(prepared, Called):
            results.append(prepared)
        else:
            jobs.append(prepared)
    flight = _Flight(setting("EVENT_CALL_CONCURRENCY"), deadline, health or outages.Snapshot())
    flight.held_until = held_until
    results.extend(_run_concurrently(jobs, flight, token, answered))
    return results


def _action_of(group: Group) -> str | None:
    return group.action_id or group.rows[0].action or None


def _action(action_id: str, actions: dict[str, _Action | None]) -> _Action | None:
    """The registered action ``action_id`` and what its calls share, read once per pass's
    `call_groups` (``actions``), or None when no module registers it."""
    if action_id in actions:
        return actions[action_id]
    action = registry.get_action(action_id)
    revert = getattr(action, "revert", None)
    actions[action_id] = found = (
        None
        if action is None
        else _Action(
            action,
            str(action.module),
            module_limit(action),
            calls.budget_under_claim(action),
            callable(revert) and calls.paced(revert),
        )
    )
    return found


def _revert_job(group: Group, actions: dict[str, _Action | None] | None = None) -> _Job | Called:
    """The revert call a step's (or a loose row's) group needs, or its verdict when none can be made."""
    action_id = _action_of(group)
    if not action_id:
        return Called(group, Verdict.terminal("nothing records which action created this"))
    shared = _action(action_id, {} if actions is None else actions)
    if shared is None:
        error = f'no module registers the action "{action_id}", so its resources cannot be given back'
        return Called(group, Verdict.terminal(error), action_id)
    action = shared.action
    resources = [
        {"kind": r.kind, "ref": r.ref, "payload": r.payload, "member_key": r.member_key}
        for r in group.rows
        if r.kind != STEP_KIND
    ]
    revert = getattr(action, "revert", None)
    if not callable(revert):
        if not resources:
            # Only the step's placeholder, and an action that can give nothing back: there
            # is nothing a person could do about it either.
            return Called(group, Verdict(Outcome.DONE), action_id)
        error = f"{action_id} declares no revert(), so nothing it made can be given back"
        return Called(group, Verdict.terminal(error), action_id)
    if not resources and group.kind == "step" and _recorded(group):
        # Only the placeholder is left, but its step recorded what it made and each of
        # those rows was resolved another way (given back, or waived by a person). An
        # empty list would ask the module for whatever the step's key made, waived
        # resources included: the placeholder resolves with no call (rule 16).
        return Called(group, Verdict(Outcome.DONE), action_id)
    key = _idempotency_key(group)
    return _Job(
        group,
        shared.module,
        group.backend,
        shared.limit,
        revert,
        {"run_id": group.run_id, "resources": resources, "idempotency_key": key},
        shared.budget_ms,
        action_id,
        [r.ref for r in group.rows if r.kind != STEP_KIND],
        shared.paced,
    )


def _recorded(group: Group) -> bool:
    """Did the group's step record what it made (a row of its own beside the placeholder)?"""
    return Resource.objects.filter(step_id=group.key).exclude(kind__in=(STEP_KIND, LEASE_KIND)).exists()


def _idempotency_key(group: Group) -> str:
    if group.kind == "step" and group.step_key:
        return group.step_key
    first = group.rows[0]
    return first.payload.get("idempotency_key") or first.ref


def module_limit(entry: object) -> int:
    """How many calls to one backend of a module may be in flight at once in a pass."""
    limit = int(setting("EVENT_CALL_CONCURRENCY"))
    own = getattr(entry, "max_concurrency", None)
    return min(limit, own) if isinstance(own, int) and own > 0 else limit


# The answers in hand are handed on for their verdicts this often while calls run.
ANSWERS_EVERY_S = 0.02


def _run_concurrently(
    jobs: Sequence[_Job],
    flight: _Flight,
    token: uuid.UUID | None = None,
    answered: Callable[[list[Called]], object] | None = None,
) -> list[Called]:
    """Start the jobs as limits allow, each under its budget; answers the `Called`s that
    ``answered`` was not told of.

    The calls that can start together start as one wave, their rows marked called by one
    statement first (`claims.mark_called`). The answers in hand are handed to ``answered``
    every `ANSWERS_EVERY_S` while calls run, so a sweeper killed mid-batch has written the
    verdicts of all but its last moment's answers; a batch that answers within that time
    writes them all at once, at its end.
    """
    pending = list(jobs)
    told, told_at = 0, time.monotonic()
    while pending or flight.calls:
        flight.land()
        fresh = len(flight.results) - told
        due = time.monotonic() - told_at >= ANSWERS_EVERY_S
        if answered is not None and fresh and due:
            answered(flight.results[told:])
            told, told_at = len(flight.results), time.monotonic()
        wave: list[_Job] = []
        waiting: list[_Job] = []
        for job in pending:
            if flight.has_room() and flight.module_has_room(job):
                flight.reserve(job)
                wave.append(job)
            else:
                waiting.append(job)
        pending = waiting
        flight.start(wave, token)
        flight.wait(told_at + ANSWERS_EVERY_S if answered is not None and len(flight.results) > told else None)
    return flight.results[told:] if answered is not None else flight.results


class _Flight:
    """The calls of a pass in flight: who may start, and which have ended or timed out."""

    def __init__(self, limit: int, deadline: dt.datetime | None, health: outages.Snapshot) -> None:
        self.limit, self.deadline, self.health = limit, deadline, health
        self.calls: dict[_Job, tuple[Future[Any], float]] = {}  # job -> (future, when its budget ends, monotonic)
        self.per_module: Counter[tuple[str, str]] = Counter()
        self.results: list[Called] = []
        self.woken = threading.Event()
        self.held_until: float | None = None  # when the claim runs out (monotonic)

    def has_room(self) -> bool:
        return len(self.calls) + self.reserved < self.limit

    def module_has_room(self, job: _Job) -> bool:
        return self.per_module[job.module, job.backend] < job.limit

    reserved = 0

    def reserve(self, job: _Job) -> None:
        """Count a job against the limits before it starts with its wave."""
        self.reserved += 1
        self.per_module[job.module, job.backend] += 1

    def start(self, wave: Sequence[_Job], token: uuid.UUID | None) -> None:
        self.reserved = 0
        if not wave:
            return
        if past(self.deadline):
            for job in wave:
                self.per_module[job.module, job.backend] -= 1
                self.results.append(Called(job.group, None, job.what))
            return
        # A paced call (its action or lease declares max_rate) waits for its turn first and
        # is marked alone, just before it is made: its attempt is spent by a call made (rule 20).
        paced = [job for job in wave if job.paced]
        self._start_marked([job for job in wave if not job.paced] if paced else list(wave), token)
        for job in paced:
            calls.take_turn(job.fn, job.module, job.backend)
            if past(self.deadline):
                self.per_module[job.module, job.backend] -= 1
                self.results.append(Called(job.group, None, job.what))
                continue
            self._start_marked([job], token, turn_taken=True)

    def _start_marked(self, wave: list[_Job], token: uuid.UUID | None, turn_taken: bool = False) -> None:
        if not wave:
            return
        if token is not None and not _mark(token, wave, self.held_until):
            for job in wave:  # not called: their attempts are given back with the verdicts
                self.per_module[job.module, job.backend] -= 1
                self.results.append(Called(job.group, None, job.what))
            return
        for job in wave:
            with log_context(run=job.group.run_id, module=job.module, backend=job.backend):
                future = calls.start(
                    job.fn,
                    what=job.what,
                    backend=job.backend,
                    verb="revert",
                    module=job.module,
                    # a call whose action sets no rate has no turn to wait for
                    turn_taken=turn_taken or not job.paced,
                    **job.kwargs,
                )
            future.add_done_callback(lambda _f: self.woken.set())
            self.calls[job] = (future, time.monotonic() + job.budget_ms / 1000)

    def land(self) -> None:
        """Take in the calls that answered or ran out of budget (a call past its budget
        no longer counts against the limits: the pass does not wait for it)."""
        self.woken.clear()
        for job, (future, expires) in list(self.calls.items()):
            if future.done() or time.monotonic() >= expires:
                del self.calls[job]
                self.per_module[job.module, job.backend] -= 1
                self.results.append(_verdict_of(job, future, self.health))

    def wait(self, answers_due: float | None = None) -> None:
        """Until a call answers or runs out of budget, or the answers in hand are due."""
        if self.calls:
            soonest = min(expires for _future, expires in self.calls.values())
            if answers_due is not None:
                soonest = min(soonest, answers_due)
            self.woken.wait(max(0.0, soonest - time.monotonic()))


def _mark(token: uuid.UUID, wave: Sequence[_Job], held_until: float | None = None) -> bool:
    """Mark a wave called before it starts, again on a new connection while the database
    is lost and the claim holds (`reconnect`); answers False when it could not be marked,
    and then nothing is called."""
    groups = [job.group for job in wave]
    until = time.monotonic() + 1.0 if held_until is None else held_until
    try:
        retried(mark_called, token, groups, until=until, what="marking calls as started")
        return True
    except DatabaseError as error:
        if lost(error):
            logger.warning("%d calls were not made: the database was lost before they could be marked", len(groups))
        else:
            logger.exception("marking %d calls as started failed", len(groups))
        connections["default"].close()
    return False


def _verdict_of(job: _Job, future: Future[Any], health: outages.Snapshot) -> Called:
    answer = future.result() if future.done() else calls.overdue(future, job.budget_ms, job.what)
    verdict = calls.classify_revert(answer, job.what, refs=job.refs)
    blamed = outages.blame(answer)
    health.record(
        job.module, blamed, backend=job.backend, key=f"{job.group.kind}:{job.group.key}", ambiguous=answer.timed_out
    )
    return Called(
        job.group,
        verdict,
        job.what,
        running=answer.still_running,
        blamed=blamed,
        module=job.module,
        backend=job.backend,
    )


# -- the keeper of calls that outlived their budget --------------------------------------


@dataclass(eq=False)
class _Hold:
    token: uuid.UUID
    selector: Q
    future: Future[Any]


_holds: list[_Hold] = []
_holds_lock = threading.Lock()
_keeper_wake = threading.Event()
_keeper: threading.Thread | None = None


def hold_overdue(token: uuid.UUID, called: Sequence[Called]) -> None:
    """After a batch's verdicts are written: keep the rows of calls still running held."""
    holds = [_Hold(token, c.group.selector, c.running) for c in called if c.running is not None]
    if not holds:
        return
    global _keeper
    with _holds_lock:
        _holds.extend(holds)
        if _keeper is None:
            _keeper = threading.Thread(target=_keep, name="cleanup-keeper", daemon=True)
            _keeper.start()
    for hold in holds:
        hold.future.add_done_callback(lambda _f: _keeper_wake.set())


def keep_overdue_claims() -> int:
    """Renew the claims of calls still running, release those whose call ended.

    Answers how many calls are still held. The rows stay ``failed`` with the timeout as
    their error throughout, so a person sees why they wait.
    """
    with _holds_lock:
        holds = list(_holds)
    ended = [h for h in holds if h.future.done()]
    running = [h for h in holds if not h.future.done()]
    if running:
        rows.keep_claims(_held_rows(running), timedelta(seconds=claim_timeout_s()))
    if ended:
        rows.let_go_claims(_held_rows(ended))
    with _holds_lock:
        for hold in ended:
            # The keeper's thread and a pass may both have seen it end: the first removes it.
            if hold in _holds:
                _holds.remove(hold)
        return len(_holds)


def _held_rows(holds: Sequence[_Hold]) -> Q:
    condition = Q()
    for hold in holds:
        condition |= hold.selector & Q(claim_token=hold.token)
    return condition


def _after_fork() -> None:
    # A forked process holds none of its parent's calls, and has no keeper yet.
    global _holds_lock, _keeper
    _holds.clear()
    _holds_lock = threading.Lock()
    _keeper = None


os.register_at_fork(after_in_child=_after_fork)


def _keep() -> None:
    """The keeper's loop: often enough that a claim never lapses while its call runs."""
    global _keeper
    interval = max(0.5, min(30.0, claim_timeout_s() / 4))
    while True:
        _keeper_wake.wait(interval)
        _keeper_wake.clear()
        try:
            keep_overdue_claims()
        except Exception:
            logger.exception("could not renew the claims of calls past their budget")
        finally:
            connections.close_all()
        with _holds_lock:
            if not _holds:
                _keeper = None
                return
