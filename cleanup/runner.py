"""Event runs: starting them, advancing their steps, ending them.
Imports the layers below it (models, ledger, registry, calls, outages, validation, queueing,
`cleanup.conf`) and, of the pass (`cleanup.sweep`), only `past` and `refresh_cleanup_status`.

A run is started from a name and an ordered list of steps, validated as a whole before
anything is stored. The advance leg performs each running run's ready steps in order,
back to back, until a ``core.wait`` holds the run or a step fails; every step writes the
ledger before it acts (`cleanup.ledger`). Every way a run ends (completed, cancelled,
aborted) queues its cleanup at once; the schedule's tick is the backstop.

One ticker at a time advances a run: it claims the run with a conditional UPDATE (token
and expiry, like the ledger's claims), and each step's attempt is taken with another,
so two tickers never perform one step at once, and a ticker that died mid-step leaves a
claim the next one takes over after ``EVENT_CLAIM_TIMEOUT_S``.
Whenever a run is left to wake at a known time (a wait, a backoff, a down backend), the
runner arms the engine's wake-up for it (`cleanup.wakeup`), and every tick ends by arming
the next one, so waits end on time rather than at the minute tick.
Before a step acts on a backend whose module has a dead-man's switch, the backend's session
is renewed when due (`cleanup.deadman`, rule 34): a run its backend let go of is aborted
with the switch's reason, and its later steps are not performed.
May import: the pass (`cleanup.sweep`), `clock`, `logs`, `ledger`, `outages`, `reconcile`, `calls`,
`registry` (and `envelopes`, its shapes), `validation`, `enqueue`, `wakeup`, `deadman`, the models and
conf; never a surface.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypedDict, cast

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from . import calls, clock, deadman, ledger, outages, reconcile, registry, tally, validation, wakeup
from .conf import claim_timeout_s, setting
from .enqueue import queue_cleanup, queue_tick
from .envelopes import PerformAnswer
from .logs import about, log_context
from .models import LEASE_KIND, IdempotencyKey, LogKind, Resource, Run, RunLog, RunStatus, Step, StepStatus
from .sweep import SweepResult, past, refresh_cleanup_status, sweep

logger = logging.getLogger(__name__)

WAIT = "core.wait"
LEASE = "core.lease"
MAX_WAIT_S = 86_400


class CleanedStep(TypedDict):
    """One step of a run spec as `validate_spec` passed it, ready to store."""

    action: str
    params: dict[str, Any]
    backend: str


class RunSpecError(validation.Invalid):
    """A run that cannot be started. ``errors`` maps each field (``steps[1].params``) to
    what is wrong with it."""


class RunStateError(Exception):
    """An operation the run's status does not allow, such as cancelling an ended run."""


class RunQuotaExceeded(RunSpecError):
    """A start refused because too many runs are running: ``EVENT_MAX_RUNNING_RUNS`` in
    all, or ``EVENT_MAX_RUNNING_RUNS_PER_USER`` started by the same actor. Nothing is
    stored; the start may be tried again once a run has ended (``retry_after_s``)."""

    retry_after_s = 60


# The advisory lock that makes the count of running runs and a start one step: two starts
# at the quota's edge cannot both see room for one more.
QUOTA_LOCK = 0x6576_5175  # "evQu"


def _count_running(actor: str | None) -> tuple[int, int]:
    """(running runs, those started by ``actor``)."""
    running = Run.objects.filter(status=RunStatus.RUNNING)
    return running.count(), (running.filter(started_by=actor).count() if actor else 0)


def _check_quota(actor: str | None) -> None:
    """Refuse a start past either quota (`RunQuotaExceeded`); called inside the start's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [QUOTA_LOCK])
    in_all, by_actor = _count_running(actor)
    most, most_each = setting("EVENT_MAX_RUNNING_RUNS"), setting("EVENT_MAX_RUNNING_RUNS_PER_USER")
    if in_all >= most:
        raise RunQuotaExceeded(
            {
                "non_field_errors": f"{in_all} runs are running, the most at once (EVENT_MAX_RUNNING_RUNS={most}); "
                "start this one once a run has ended"
            }  # fmt: skip
        )
    if actor and by_actor >= most_each:
        raise RunQuotaExceeded(
            {
                "non_field_errors": f"{actor} has {by_actor} runs running, the most one user may have at once "
                f"(EVENT_MAX_RUNNING_RUNS_PER_USER={most_each}); start this one once one of them has ended"
            }  # fmt: skip
        )


class CoreWait(registry.Action):
    """``{"seconds": n}``: hold the run for n seconds (0 to 86400) before its next step."""

    id = WAIT
    module = "core"

    def validate(self, params: dict[str, Any]) -> None:
        seconds = params.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ValueError(f"seconds must be a number from 0 to {MAX_WAIT_S}, got {seconds!r}")
        if not 0 <= seconds <= MAX_WAIT_S:
            raise ValueError(f"seconds must be from 0 to {MAX_WAIT_S}, got {seconds!r}")

    def perform(self, **kwargs: Any) -> PerformAnswer:  # the runner holds the run itself
        return {"ok": True, "resources": []}


class CoreLease(registry.Action):
    """``{"lease", "target", "value"}``: apply a registered lease for the rest of the run.

    The runner reads the baseline, records the lease in the ledger, then applies the
    value; the cleanup restores the baseline when the run ends.
    """

    id = LEASE
    module = "core"

    def validate(self, params: dict[str, Any]) -> None:
        unknown = sorted(set(params) - {"lease", "target", "value"})
        if unknown:
            raise ValueError(f"{unknown[0]} is not a parameter of {LEASE}")
        lease_id = params.get("lease")
        lease = registry.get_lease(lease_id) if isinstance(lease_id, str) else None
        if lease is None:
            raise ValueError(f"lease: no module registers the lease {lease_id!r}")
        target = params.get("target")
        if not isinstance(target, str) or not target.strip():
            raise ValueError(f"target must be a non-empty string, got {target!r}")
        if message := validation.text_error(target, validation.MAX_TARGET):
            raise ValueError(f"target {message}")
        if "value" not in params:
            raise ValueError("value is required")
        validate = getattr(lease, "validate", None)
        if callable(validate):
            # The lease says which values it can apply; one it cannot would abort the run
            # and leave a row whose restore fails for good.
            try:
                validate(params["value"])
            except ValueError as exc:
                raise ValueError(f"value: {exc}") from None
            except Exception as exc:  # a module's validate is untrusted too
                raise ValueError(f"value: {lease_id} could not check it: {type(exc).__name__}: {exc}") from None

    def perform(self, **kwargs: Any) -> PerformAnswer:
        return {"ok": False, "error": "core.lease is performed by the runner", "retry": False}


def register_builtins() -> None:
    for action in (CoreWait(), CoreLease()):
        if registry.get_action(action.id) is None:
            registry.register_action(action)


# -- starting -------------------------------------------------------------------------


def _name_error(name: object) -> str | None:
    if isinstance(name, str) and not name.strip() and "\x00" not in name:
        return "a run needs a non-empty name"
    message = validation.text_error(name, validation.MAX_NAME)
    return f"a name {message}" if message else None


def validate_spec(name: object, steps: object) -> list[CleanedStep]:
    """The cleaned steps of a run spec, or `RunSpecError` naming every bad field.

    Everything a run stores is checked here (`cleanup.validation`): the name, the number
    of steps (``EVENT_MAX_STEPS``), each step's action and params (JSON that PostgreSQL
    can store, at most ``EVENT_MAX_PARAMS_BYTES``), then the action's own ``validate``.
    """
    errors: dict[str, str] = {}
    if message := _name_error(name):
        errors["name"] = message
    if not isinstance(steps, list) or not steps:
        errors["steps"] = "a run needs a non-empty list of steps"
        raise RunSpecError(errors)
    max_steps = validation.limit("EVENT_MAX_STEPS")
    if len(steps) > max_steps:
        errors["steps"] = f"a run has at most {max_steps} steps (EVENT_MAX_STEPS), got {len(steps)}"
        raise RunSpecError(errors)
    cleaned: list[CleanedStep] = []
    for position, step in enumerate(steps):
        where = f"steps[{position}]"
        step_errors = _step_errors(step, where)
        if not step_errors:
            params = step.get("params") or {}
            backend, problem = _backend_of(step["action"], params)
            if problem is not None:
                step_errors = {f"{where}.params": problem}
            elif backend is not None:
                cleaned.append({"action": step["action"], "params": params, "backend": backend})
        errors.update(step_errors)
    if errors:
        raise RunSpecError(errors)
    return cleaned


def _step_errors(step: object, where: str) -> dict[str, str]:
    """What is wrong with one step, keyed by field; empty when it can be stored."""
    if not isinstance(step, dict):
        return {where: 'each step is an object {"action", "params"}'}
    errors: dict[str, str] = {}
    unknown = sorted(set(step) - {"action", "params"})
    if unknown:
        errors[where] = f"unknown field(s) {', '.join(map(repr, unknown))}"
    action_id = step.get("action")
    if message := validation.text_error(action_id, validation.MAX_ACTION):
        return {**errors, f"{where}.action": f"an action id {message}"}
    params = step.get("params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        return {**errors, f"{where}.params": f"params must be an object, not {validation.json_type(params)}"}
    problem = validation.json_problem(params, f"{where}.params", clean=True)
    if problem is None and (message := validation.params_error(params)):
        problem = (f"{where}.params", message)
    if problem:
        return {**errors, problem[0]: problem[1]}
    action = registry.get_action(cast(str, action_id))  # text_error refused any other
    if action is None:
        return {**errors, f"{where}.action": f"no module registers the action {action_id!r}"}
    validate = getattr(action, "validate", None)
    if callable(validate):
        try:
            validate(params)
        except ValueError as exc:
            errors[f"{where}.params"] = str(exc)
        except Exception as exc:  # a module's validate is untrusted too
            errors[f"{where}.params"] = f"{action_id} could not check its params: {type(exc).__name__}: {exc}"
    return errors


def _backend_of(action_id: str, params: dict[str, Any]) -> tuple[str, None] | tuple[None, str]:
    """Which backend a valid step acts on: ``(backend, None)``, or ``(None, error)``."""
    if action_id == LEASE:
        lease = registry.get_lease(params["lease"])
        return calls.backend_of(lease, params["target"], params["lease"])
    return calls.backend_of(registry.get_action(action_id), params, action_id)


def start_run(name: object, steps: object, actor: str | None = None, quota: bool = True) -> Run:
    """Validate and store a run, then queue a tick so it starts at once.

    Refused (`RunQuotaExceeded`) when ``EVENT_MAX_RUNNING_RUNS`` runs are running, or
    ``EVENT_MAX_RUNNING_RUNS_PER_USER`` that ``actor`` started. ``quota=False`` is for the
    bench alone, which measures the engine at sizes past the quotas.
    """
    validation.check_actor(actor)
    cleaned = validate_spec(name, steps)
    with transaction.atomic():
        if quota:
            _check_quota(actor)
        # `validate_spec` refused a name that is not a string.
        run = Run.objects.create(name=cast(str, name).strip(), wake_at=clock.now(), started_by=actor or "")
        Step.objects.bulk_create(
            Step(
                run=run,
                position=position,
                action_id=step["action"],
                params=step["params"],
                backend=step["backend"],
                idempotency_key=uuid.uuid4().hex,
            )
            for position, step in enumerate(cleaned)
        )
        RunLog.write(run.pk, LogKind.RUN_STARTED, steps=len(cleaned), by=actor)
        queue_tick()
    return run


# -- ending ---------------------------------------------------------------------------


def _end(run_id: int, status: str, kind: str, auto_cleanup: bool = True, **detail: Any) -> bool:
    """Move a running run to a terminal status; answers False when it was not running.

    Every end queues the run's cleanup once it commits, unless a person keeps the rows
    (rule 1); the steps it leaves unfinished read `cancelled` (rule 33).
    """
    now = clock.now()
    with transaction.atomic():
        won = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
            status=status, ended_at=now, wake_at=None, auto_cleanup=auto_cleanup, updated_at=now
        )
        if not won:
            return False
        if status != RunStatus.COMPLETED:
            # Steps that never finished will not: they read `cancelled`, not `running`.
            Step.objects.filter(run_id=run_id, status__in=(StepStatus.PENDING, StepStatus.RUNNING)).update(
                status=StepStatus.CANCELLED, finished_at=now, next_attempt_at=None, waiting_since=None
            )
        RunLog.write(run_id, kind, **detail)
    run = Run.objects.get(pk=run_id)
    refresh_cleanup_status(run)
    if auto_cleanup:
        queue_cleanup(run_id)
    return True


def cancel_run(run_id: int, cleanup: bool = True, actor: str | None = None) -> Run:
    """Cancel a running run. With ``cleanup=False`` its rows wait for a person (rule 7)."""
    validation.check_actor(actor)
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise Run.DoesNotExist(f"there is no run {run_id}")
    if not _end(run_id, RunStatus.CANCELLED, LogKind.RUN_CANCELLED, auto_cleanup=cleanup, by=actor, cleanup=cleanup):
        run.refresh_from_db()
        raise RunStateError(f"run {run_id} is already {run.status}; only a running run can be cancelled")
    run.refresh_from_db()
    return run


# -- advancing ------------------------------------------------------------------------


@dataclass
class AdvanceResult:
    runs: int = 0
    performed: int = 0
    work_left: bool = False  # stopped at a bound: more runs or steps may be due


def due_runs(now: dt.datetime | None, limit: int) -> list[int]:
    """Running runs due now (the database's clock when ``now`` is None) and claimed by no ticker."""
    at = clock.at() if now is None else now
    return list(
        Run.objects.filter(status=RunStatus.RUNNING)
        .filter(Q(wake_at__isnull=True) | Q(wake_at__lte=at))
        .filter(Q(claim_token__isnull=True) | Q(claim_expires_at__lt=at))
        .order_by(F("wake_at").asc(nulls_first=True), "id")
        .values_list("id", flat=True)[:limit]
    )


def advance(by: str = "tick", deadline: dt.datetime | None = None) -> AdvanceResult:
    """The advance leg: every due running run, at most ``EVENT_ADVANCE_RUN_BATCH`` of them.

    Past ``deadline`` no further step is started; the run stays due for the next tick.
    """
    limit = setting("EVENT_ADVANCE_RUN_BATCH")
    ids = due_runs(None, limit)
    result = AdvanceResult(work_left=len(ids) >= limit)
    for run_id in ids:
        if past(deadline):
            result.work_left = True
            break
        try:
            with log_context(run=run_id):
                performed = advance_run(run_id, deadline=deadline)
        except Exception:
            logger.exception("advancing run %s failed", run_id, extra=about(run=run_id))
            continue
        if performed is not None:
            result.runs += 1
            result.performed += performed
    if past(deadline):
        result.work_left = True  # a run may have been left between two steps
    return result


class _Claim:
    """A ticker's hold on one run, renewed before each step: one ticker at a time (rule 17)."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.token = uuid.uuid4()

    def take(self) -> int:
        """Claim the run if it is due and unclaimed, on the database's clock (rule 9)."""
        return Run.objects.filter(
            Q(claim_token__isnull=True) | Q(claim_expires_at__lt=clock.at()),
            Q(wake_at__isnull=True) | Q(wake_at__lte=clock.at()),
            pk=self.run_id,
            status=RunStatus.RUNNING,
        ).update(claim_token=self.token, claim_expires_at=clock.after(claim_timeout_s()))

    def renew(self) -> int:
        """Still ours, and the run still running? Renewing answers both."""
        return Run.objects.filter(pk=self.run_id, claim_token=self.token, status=RunStatus.RUNNING).update(
            claim_expires_at=clock.after(claim_timeout_s())
        )

    def release(self, wake_at: dt.datetime | None = None) -> None:
        Run.objects.filter(pk=self.run_id, claim_token=self.token).update(
            claim_token=None, claim_expires_at=None, wake_at=wake_at
        )


def advance_run(run_id: int, deadline: dt.datetime | None = None) -> int | None:
    """Perform a run's ready steps in order; answers how many, or None if not claimed."""
    claim = _Claim(run_id)
    if not claim.take():
        return None
    performed = 0
    wake_at: dt.datetime | None = None
    try:
        while not past(deadline) and claim.renew():
            step = Step.objects.filter(run_id=run_id).exclude(status=StepStatus.DONE).order_by("position").first()
            if step is None:
                _end(
                    run_id, RunStatus.COMPLETED, LogKind.RUN_COMPLETED, steps=Step.objects.filter(run_id=run_id).count()
                )
                break
            now = clock.now()
            if step.next_attempt_at and step.next_attempt_at > now:
                wake_at = step.next_attempt_at
                break
            if step.action_id == WAIT:
                wake_at = _wait(step, now)
                if wake_at:
                    break
                continue
            if step.status == StepStatus.RUNNING and step.attempts >= setting("EVENT_STEP_MAX_ATTEMPTS"):
                # The ticker that spent the last attempt died before it had an answer.
                outcome = _record_outcome(
                    step,
                    calls.Performed(ok=False, error="the ticker performing this step stopped before it had an answer"),
                )
                wake_at = None if outcome is True else outcome  # a failure is never done (True)
                break
            held = outages.hold(_module_of(step), now, backend=step.backend)
            if held is not None:
                wake_at = _wait_for_module(step, held)
                break
            if _let_go(step):
                break
            outcome = _perform(step)
            if outcome is True:
                performed += 1
                continue
            wake_at = outcome
            break
    finally:
        claim.release(wake_at=wake_at)
    if wake_at is not None and wake_at > clock.now():
        wakeup.arm(wake_at)  # on time, not at the next minute tick
    return performed


def _module_of(step: Step) -> str | None:
    """The module a step calls, or None (a built-in wait, an unregistered action)."""
    module: str | None = outages.step_module(step)
    return module


def _let_go(step: Step) -> bool:
    """Rule 34: the step's backend's session, renewed when due; True when the backend's
    switch had let go of this step's run, which is aborted (its later steps not performed)."""
    renewal = deadman.prepare(_module_of(step), step.backend)
    if renewal is None:
        return False
    end_lapsed([renewal])
    return not Run.objects.filter(pk=step.run_id, status=RunStatus.RUNNING).exists()


def end_lapsed(renewals: list[deadman.Renewal]) -> None:
    """Abort each run that a backend's switch let go of while it ran, with the switch's
    reason: those the renewals name, and any other the log says was let go of."""
    for renewal in renewals:
        for run_id in renewal.abort:
            _end(run_id, RunStatus.ABORTED, LogKind.RUN_ABORTED, error=renewal.reason)
    for run_id, reason in deadman.runs_let_go():
        _end(run_id, RunStatus.ABORTED, LogKind.RUN_ABORTED, error=reason)


def keep_alive() -> list[deadman.Renewal]:
    """Renew every dead-man's switch session that is due, and end the runs a lapse let go
    of (rule 34); answers the renewals. From the tick and from the keepalive task."""
    renewals = deadman.renew_due()
    end_lapsed(renewals)
    return renewals


def _wait_for_module(step: Step, until: dt.datetime) -> dt.datetime:
    """Hold the step while its module is down; say why once per outage. Answers ``until``."""
    health = outages.outage_of(_module_of(step), backend=step.backend)
    reason = health.waiting_text() if health else "waiting for its module to answer again"
    since = health.down_since if health and health.down_since else clock.now()
    # Its own field, never text in last_error, which keeps the step's own last error.
    first = Step.objects.filter(pk=step.pk).filter(Q(waiting_since__isnull=True) | ~Q(waiting_since=since)).exists()
    Step.objects.filter(pk=step.pk).update(waiting_since=since, next_attempt_at=until)
    if first:
        RunLog.write(
            step.run_id,
            LogKind.STEP_WAITING,
            position=step.position,
            action=step.action_id,
            module=getattr(health, "module", None),
            reason=reason,
            until=until.isoformat(),
            **({"backend": step.backend} if step.backend else {}),
        )
    return until


def _wait(step: Step, now: dt.datetime) -> dt.datetime | None:
    """Hold the run on a ``core.wait``; answers when to look again, or None once it passed."""
    seconds = float(step.params.get("seconds", 0))
    if step.started_at is None:
        Step.objects.filter(pk=step.pk, started_at__isnull=True).update(status=StepStatus.RUNNING, started_at=now)
        step.started_at = now
        if seconds > 0:
            RunLog.write(
                step.run_id,
                LogKind.STEP_WAITING,
                position=step.position,
                seconds=seconds,
                until=(now + timedelta(seconds=seconds)).isoformat(),
            )
    until = step.started_at + timedelta(seconds=seconds)
    if until > now:
        return until
    Step.objects.filter(pk=step.pk).update(status=StepStatus.DONE, finished_at=now)
    RunLog.write(step.run_id, LogKind.STEP_PERFORMED, position=step.position, action=WAIT, waited_s=seconds)
    return None


def _perform(step: Step) -> Literal[True] | dt.datetime | None:
    """One attempt at one step: True when done, else when to look at the run again."""
    now = clock.now()
    taken = Step.objects.filter(
        pk=step.pk, status__in=(StepStatus.PENDING, StepStatus.RUNNING), attempts=step.attempts
    ).update(
        status=StepStatus.RUNNING, attempts=F("attempts") + 1, started_at=now, next_attempt_at=None, waiting_since=None
    )
    if not taken:
        return clock.now()  # another ticker moved this step: look again
    step.refresh_from_db()
    if step.action_id == LEASE:
        performed = _perform_lease(step)
    else:
        performed = _perform_action(step)
    return _record_outcome(step, performed)


def _perform_action(step: Step) -> calls.Performed:
    action = registry.get_action(step.action_id)
    if action is None:
        return calls.Performed(ok=False, error=f"no module registers the action {step.action_id!r}", retry=False)
    ledger.write_placeholder(step, action.module or "")
    answer = outages.call(
        action,
        action.perform,
        budget_ms=calls.budget_under_claim(action),
        what=step.action_id,
        backend=step.backend,
        verb="perform",
        run_id=step.run_id,
        step_id=step.pk,
        params=step.params,
        idempotency_key=step.idempotency_key,
        **deadman.session_kwargs(action.module, step.backend, action.perform),
    )
    performed = calls.classify_perform(answer, step.action_id)
    if performed.ok:
        # Recorded even when the run was cancelled meanwhile: what exists must be ledgered
        # to be given back.
        ledger.record_resources(step, action.module or "", performed.resources)
    return performed


def _perform_lease(step: Step) -> calls.Performed:
    params = step.params
    lease = registry.get_lease(params.get("lease"))
    if lease is None:
        return calls.Performed(ok=False, error=f"no module registers the lease {params.get('lease')!r}", retry=False)
    target = params["target"]
    row = Resource.objects.filter(step=step, kind=LEASE_KIND).first()
    if row is None:
        # Read and reserve once per step: a retry after an apply that may have landed
        # must not read the applied value as the baseline.
        reply = calls.classify_reply(
            outages.call(
                lease,
                lease.read,
                budget_ms=calls.budget_under_claim(lease),
                what=f"{lease.id}.read",
                backend=step.backend,
                target=target,
            ),
            f"{lease.id}.read",
            key="value",
        )
        if not reply.ok:
            return calls.Performed(ok=False, error=reply.error, retry=reply.retry)
        row = ledger.reserve_lease(step, lease, target, baseline=reply.value, applied=params["value"])
    reply = calls.classify_reply(
        outages.call(
            lease,
            lease.apply,
            budget_ms=calls.budget_under_claim(lease),
            what=f"{lease.id}.apply",
            backend=step.backend,
            value=params["value"],
            run_id=step.run_id,
            target=target,
            **deadman.session_kwargs(lease.module, step.backend, lease.apply),
        ),
        f"{lease.id}.apply",
    )
    if not reply.ok:
        return calls.Performed(ok=False, error=reply.error, retry=reply.retry)
    ledger.confirm_lease(row)
    return calls.Performed(ok=True, resources=({"kind": LEASE_KIND, "ref": row.ref},))


def _record_outcome(step: Step, performed: calls.Performed) -> Literal[True] | dt.datetime | None:
    """Write an attempt's outcome, unless another ticker has taken the step over since.

    What the attempt made is in the ledger either way (`_perform_action` recorded it).
    """
    now = clock.now()
    run = Run.objects.get(pk=step.run_id)
    ours = Step.objects.filter(pk=step.pk, status=StepStatus.RUNNING, attempts=step.attempts)
    if performed.ok:
        # A step whose run was cancelled while it performed did finish: it reads `done`.
        finished = Step.objects.filter(
            pk=step.pk, status__in=(StepStatus.RUNNING, StepStatus.CANCELLED), attempts=step.attempts
        )
        if not finished.update(status=StepStatus.DONE, finished_at=now, last_error=""):
            return now
        RunLog.write(
            step.run_id,
            LogKind.STEP_PERFORMED,
            position=step.position,
            action=step.action_id,
            attempt=step.attempts,
            resources=len(performed.resources),
        )
        if run.is_terminal:
            # The run ended while this step performed: what it made is in the ledger now
            # and its cleanup must see it.
            refresh_cleanup_status(run)
            if run.auto_cleanup:
                queue_cleanup(run.pk)
            return now
        return True
    if performed.retry and (outage := outages.outage_of(_module_of(step), now, backend=step.backend)) is not None:
        # The module's backend is down: this failure is the outage's, not the step's, and
        # spends no attempt. The step waits for the module to answer again.
        if not ours.update(status=StepStatus.PENDING, attempts=F("attempts") - 1, finished_at=None):
            return now
        return _wait_for_module(step, outage.next_probe_at or now)
    last = not performed.retry or step.attempts >= setting("EVENT_STEP_MAX_ATTEMPTS")
    retry_at = None if last else now + timedelta(seconds=setting("EVENT_STEP_BACKOFF_S") * 2 ** (step.attempts - 1))
    if not ours.update(
        status=StepStatus.FAILED if last else StepStatus.PENDING,
        last_error=performed.error,
        next_attempt_at=retry_at,
        finished_at=now if last else None,
    ):
        # The run ended while this step performed: the step stays `cancelled`, with its error.
        if Step.objects.filter(pk=step.pk, status=StepStatus.CANCELLED, attempts=step.attempts).update(
            last_error=performed.error
        ):
            _log_step_failed(step, performed.error, retrying=False)
        return now
    _log_step_failed(step, performed.error, retrying=not last)
    if last:
        _end(step.run_id, RunStatus.ABORTED, LogKind.RUN_ABORTED, position=step.position, error=performed.error)
        return now
    return retry_at


def _log_step_failed(step: Step, error: str, *, retrying: bool) -> None:
    RunLog.write(
        step.run_id,
        LogKind.STEP_FAILED,
        position=step.position,
        action=step.action_id,
        attempt=step.attempts,
        error=error,
        retrying=retrying,
    )


# -- the tick -------------------------------------------------------------------------


@dataclass
class TickResult:
    advance: AdvanceResult
    sweep: SweepResult
    watched: int = 0  # backends asked for their health (`cleanup.outages.watch`)
    owed: reconcile.OwedResult | None = None  # the owed reconciles it made (`cleanup.reconcile.pay_owed`)

    @property
    def work_left(self) -> bool:
        return self.advance.work_left or self.sweep.work_left or bool(self.owed and self.owed.work_left)

    def line(self) -> str:
        swept: str = self.sweep.line()
        line = f"advanced {self.advance.runs} run(s), performed {self.advance.performed} step(s); " + swept
        if self.owed and (self.owed.paid or self.owed.left):
            line += f"; owed reconciles: {self.owed.paid} done, {self.owed.left} still owed"
        return line


# A busy site ticks many times a minute; the watch looks for due backends at most this
# often in one process (each backend is asked at most every EVENT_BACKEND_WATCH_S anyway).
WATCH_EVERY_S = 10
_last_watch: dict[str, float | None] = {"at": None}


def _watch() -> int:
    """The backends' health, at the tick: a restart nobody reported is caught even when no
    run is active (`cleanup.outages.watch`). Its failure never fails the tick."""
    at = time.monotonic()
    last = _last_watch["at"]
    if last is not None and at - last < WATCH_EVERY_S:
        return 0
    _last_watch["at"] = at
    try:
        watched: int = outages.watch()
        return watched
    except Exception:
        logger.exception("watching the backends failed; the next tick tries again")
        return 0


def keep_alive_loop(
    seconds: float, sleep: Callable[[float], None] = time.sleep, token: uuid.UUID | None = None
) -> bool:
    """Renew each session as it falls due, for about ``seconds`` (rule 34), for a ttl the
    minute schedule cannot keep. Answers True when it kept going to the end, holding the
    sessions a renewal past it for the task that goes on with the same ``token``; False
    when it stopped early: no session is kept, or another loop holds them
    (`deadman.hold_loop`)."""
    token = token or uuid.uuid4()
    end = time.monotonic() + seconds
    while True:
        ttl = deadman.ttl_s()
        left = dt.timedelta(seconds=max(end - time.monotonic(), 0.0))
        if not ttl or not deadman.hold_loop(token, clock.now() + left + deadman.renew_every(ttl)):
            return False
        due = deadman.next_due()
        if due is None:
            return False
        wait = max((due - clock.now()).total_seconds(), 0.0)
        if time.monotonic() + wait > end:
            return True
        sleep(wait + 0.05)
        keep_alive()


def _keep_alive() -> list[deadman.Renewal]:
    """The dead-man's switch sessions, renewed at the tick (rule 34). Never fails the tick."""
    try:
        return keep_alive()
    except Exception:
        logger.exception("renewing the dead-man's switch sessions failed; the next tick tries again")
        return []


def _pay_owed(deadline: dt.datetime) -> reconcile.OwedResult | None:
    """The reconciles backends owe after a restart (rule 14), a bounded number per tick:
    paid here whether or not a cluster runs the task queued for them. Never fails the tick."""
    try:
        owed: reconcile.OwedResult = reconcile.pay_owed(deadline=deadline)
        return owed
    except Exception:
        logger.exception("paying the owed reconciles failed; the next tick tries again")
        return None


def tick(by: str = "tick") -> TickResult:
    """Advance, then clean up, then watch the backends' health, then make the reconciles
    owed after a restart, once. A tick that reached a bound queues the next at once.

    Both legs share ``EVENT_TICK_BUDGET_S``: past it they start nothing new, so that a
    tick ends well inside django-q2's task timeout even against a shard that hangs (rule 26).
    """
    deadline = timezone.now() + timedelta(seconds=setting("EVENT_TICK_BUDGET_S"))
    # First contact: a backend whose switch let go while the core was away says so before
    # the sweep could call it for the rows it gave back itself.
    _keep_alive()
    result = TickResult(advance=advance(by=by, deadline=deadline), sweep=sweep(by=by, deadline=deadline))
    if not past(deadline):
        result.watched = _watch()
    if not past(deadline):
        result.owed = _pay_owed(deadline)
    # The API's expired Idempotency-Keys go here, a bounded batch at a time, and the runs'
    # tally is folded to a row per pair, so that a scrape adds up a minute's changes at most.
    IdempotencyKey.objects.prune()
    tally.fold()
    if result.work_left:
        queue_tick()
    else:
        wakeup.arm_next()  # the next wait, backoff or resume that falls due, on time
    return result
