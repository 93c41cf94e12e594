"""A module's backend is down: its work waits, and spends no attempts, until it answers.

Attempts exist to stop a row that cannot be given back from being tried for ever, not to
count the minutes a shard spent restarting. So the engine tells an answer that blames the
backend (no answer within the budget, a backend that could not be reached, an envelope
with ``"unavailable": true``) from an answer about the row, and counts the former per
backend of a module, across rows and runs. ``EVENT_OUTAGE_AFTER`` of them in a row mark
that backend down; its rows and steps are then not attempted, and the answers that led to
it are forgiven (their attempts are given back to the rows): an outage spends no attempts
(rule 21). The module's other backends are worked as usual: one shard's outage holds only
its own work.

While a backend is down, one probe at a time is let through at most every
``EVENT_OUTAGE_PROBE_S``: the module's ``health(backend=...)`` when one of its actions or
leases has it, else one ordinary call (a canary). Any answer that does not blame the
backend marks it up, and its waiting rows are spread over ``EVENT_OUTAGE_SPREAD_S`` seconds,
a step's rows together, so a recovering shard is not hit by all of them at once (rule 22).
An outage longer than ``EVENT_OUTAGE_GIVE_UP_S`` ends the wait: the caller fails the waiting
work with the reason, and nothing waits silently for ever (rule 23).

A backend that holds live or recently given-back rows is also watched while it is up
(`watch`): its ``health()`` is asked at least every ``EVENT_BACKEND_WATCH_S``, and a boot
id other than the last one seen is a restart nobody reported (rule 14). A restart, seen so or
reported by the module, is a debt on the health row, written with the boot id in one
transaction (`owe_reconcile`); `cleanup.reconcile.pay_owed` pays it at the tick, claiming it
(`claim_owed`) and clearing only the debt it paid (`clear_owed`).

The state lives in `ModuleHealth`, one row per ``(module, backend)``, so every sweeper and
ticker shares it; every change is a conditional UPDATE, and only the worker whose UPDATE
changed the row logs the change. Every function takes ``backend=""``: a module with one
backend passes nothing.
A backend marked up resumes its work at once: its held steps are due now, and the
engine's wake-up (`cleanup.wakeup`) ticks now and again as each bucket of the spread falls due.
May import: the models, conf, `clock`, `logs`, `calls`, `registry`, `enqueue`, `validation`, `wakeup`.
Imported by the runner and the pass.
"""

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce, Mod

from . import calls, clock, registry, rows, validation, wakeup
from .conf import claim_timeout_s, setting
from .enqueue import queue_owed_reconcile
from .logs import about
from .models import (
    UNRESOLVED,
    Attempt,
    AttemptOutcome,
    LogKind,
    ModuleEvent,
    ModuleEventKind,
    ModuleHealth,
    ModuleState,
    Resource,
    ResourceState,
    Run,
    RunLog,
    RunStatus,
    Step,
    StepStatus,
    backend_name,
)

logger = logging.getLogger(__name__)

# The outcome an attempt is recorded with when its answer blamed the backend.
UNAVAILABLE = AttemptOutcome.UNAVAILABLE
SPREAD_BUCKETS = 10


def blame(answer: calls.Answer) -> str | None:
    """Why ``answer`` (a `calls.Answer`) blames the module's backend, or None.

    None means the backend answered: a success, or a failure about the row itself.
    """
    if answer.timed_out:
        return answer.exception or "no answer within the budget"
    if getattr(answer, "unreachable", False):
        return answer.exception or "the backend could not be reached"
    raw = answer.raw
    if isinstance(raw, dict) and raw.get("ok") is not True and raw.get("unavailable") is True:
        error = raw.get("error")
        return error.strip() if isinstance(error, str) and error.strip() else "the backend is unavailable"
    return None


def _rows(module: str, backend: str = "") -> QuerySet[ModuleHealth]:
    return ModuleHealth.objects.filter(module=module, backend=backend)


def _health(module: str, backend: str = "") -> ModuleHealth:
    """The backend's row, made on first need (two workers racing make one)."""
    try:
        with transaction.atomic():
            return ModuleHealth.objects.get_or_create(module=module, backend=backend)[0]
    except IntegrityError:
        return ModuleHealth.objects.get(module=module, backend=backend)


def record(
    module: str,
    reason: str | None,
    *,
    backend: str = "",
    key: str = "",
    ambiguous: bool = False,
    now: datetime | None = None,
) -> bool:
    """Count one answer from a module's backend; ``reason`` is what `blame` said of it.

    Answers True when this answer marked the backend down. An answer that does not blame
    the backend ends a run of failures, and marks a down backend up: it answered.

    ``ambiguous`` (no answer within the budget) may be the call's own fault, a poison
    pill that hangs whatever the backend: such an answer for ``key`` (the group called)
    counts only when the last one counted was for another key, so one group that hangs
    again and again never marks its backend down; it spends its attempts like any row.
    """
    now = now or clock.now()
    rows = _rows(module, backend)
    if reason is None:
        rows.filter(failures_in_row__gt=0).update(failures_in_row=0, streak_started_at=None, updated_at=now)
        if rows.filter(state=ModuleState.DOWN).exists():
            mark_up(module, backend=backend, by="engine", now=now)
        return False
    _health(module, backend)
    counted = rows
    if ambiguous and key:
        counted = counted.exclude(last_blamed_key=key)
    rows.filter(failures_in_row=0).update(streak_started_at=now)
    if not counted.update(
        failures_in_row=F("failures_in_row") + 1, last_error=reason[:2000], last_blamed_key=key[:500], updated_at=now
    ):
        return False
    return _mark_down_after_streak(module, backend, now)


def _mark_down_after_streak(module: str, backend: str, now: datetime) -> bool:
    with transaction.atomic():
        rows.taking(rows.HEALTH)  # the health row, then the rows it forgives
        marked = (
            _rows(module, backend)
            .filter(state=ModuleState.UP, failures_in_row__gte=setting("EVENT_OUTAGE_AFTER"))
            .update(
                state=ModuleState.DOWN,
                down_since=now,
                gave_up_at=None,
                changed_by="engine",
                next_probe_at=now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")),
                held=False,
                held_until=None,
                updated_at=now,
            )
        )
        if not marked:
            return False
        health = _rows(module, backend).get()
        forgiven = forgive_streak(health)
        defer_waiting(module, health.next_probe_at, backend=backend)
        _log(
            module,
            ModuleEventKind.DOWN,
            now,
            backend=backend,
            by="engine",
            error=health.last_error,
            failures=health.failures_in_row,
            forgiven=forgiven,
        )
    logger.warning(
        "%s marked down: %s",
        backend_name(module, backend),
        health.last_error,
        extra=about(module=module, backend=backend),
    )
    return True


def lock_health(pairs: Iterable[tuple[str, str]]) -> list[ModuleHealth]:
    """Lock the health rows of ``(module, backend)`` pairs for the caller's transaction, in
    one order, so a verdict that reads whether a backend is down and a mark-down that
    forgives its rows never cross."""
    rows.taking(rows.HEALTH)
    condition = Q()
    for module, backend in pairs:
        condition |= Q(module=module, backend=backend)
    return list(ModuleHealth.objects.select_for_update().filter(condition).order_by("module", "backend"))


def forgive_streak(health: ModuleHealth) -> int:
    """Give back the attempts that the answers leading to an outage spent.

    Those answers blamed the backend: the rows were not at fault. Each row of that backend
    gets back the number of its attempts the streak spent.
    """
    if health.streak_started_at is None:
        return 0
    spent = (
        Attempt.objects.filter(resource=OuterRef("pk"), outcome=UNAVAILABLE, at__gte=health.streak_started_at)
        .values("resource")
        .annotate(n=Count("id"))
        .values("n")
    )
    blamed = Resource.objects.filter(
        module=health.module,
        backend=health.backend,
        attempts__outcome=UNAVAILABLE,
        attempts__at__gte=health.streak_started_at,
    )
    ids = list(blamed.values_list("id", flat=True).distinct())
    if not ids:
        return 0
    return rows.forgive(Q(pk__in=ids), Subquery(spent))


def mark_down(
    module: str,
    *,
    by: str,
    backend: str = "",
    reason: str = "",
    until: datetime | None = None,
    now: datetime | None = None,
) -> bool:
    """A person marks a module's backend down; answers whether it changed.

    It holds (a maintenance window): no probe, canary or answer marks the backend up, only a
    person does, or the time ``until`` when given. Probes still look and say what they saw.
    The reason and who are clean text (`validation.Invalid` names the field otherwise).
    """
    validation.check_actor(by, "by")
    if reason and (problem := validation.clean_text_problem(reason)):
        raise validation.Invalid({"reason": problem})
    now = now or clock.now()
    _health(module, backend)
    with transaction.atomic():
        rows.taking(rows.HEALTH)  # the health row, then the rows it forgives
        marked = (
            _rows(module, backend)
            .filter(state=ModuleState.UP)
            .update(
                state=ModuleState.DOWN,
                down_since=now,
                gave_up_at=None,
                changed_by=by,
                last_error=reason or f"marked down by {by}",
                next_probe_at=now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")),
                held=True,
                held_until=until,
                last_probe="",
                last_probe_at=None,
                updated_at=now,
            )
        )
        if marked:
            defer_waiting(module, now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")), backend=backend)
            _log(module, ModuleEventKind.DOWN, now, backend=backend, by=by, error=reason or f"marked down by {by}")
    return bool(marked)


# Who marks a backend up without being a person: a person's hold does not yield to them.
ENGINE_ACTORS = ("engine", "probe")


def mark_up(module: str, *, by: str, backend: str = "", now: datetime | None = None) -> bool:
    """Mark a module's backend up (a person, or an answer that proved it); answers whether it changed.

    A backend a person holds down (`mark_down`) is marked up only by a person, or by the
    engine once the hold's ``until`` has passed. Its waiting rows resume at once, spread
    over ``EVENT_OUTAGE_SPREAD_S``.
    """
    now = now or clock.now()
    with transaction.atomic():
        rows.taking(rows.HEALTH)
        health = _rows(module, backend).select_for_update().filter(state=ModuleState.DOWN).first()
        if health is None or (by in ENGINE_ACTORS and health.held_at(now)):
            return False
        ModuleHealth.objects.filter(pk=health.pk).update(
            state=ModuleState.UP,
            failures_in_row=0,
            streak_started_at=None,
            next_probe_at=None,
            changed_by=by,
            held=False,
            held_until=None,
            updated_at=now,
        )
        down_for = (now - health.down_since).total_seconds() if health.down_since else None
        _log(module, ModuleEventKind.UP, now, backend=backend, by=by, down_for_s=down_for, last_error=health.last_error)
    # The rows deferred to the next probe waited for this: they resume now, not at that probe.
    spread_waiting(module, now, backend=backend, deferred_until=health.next_probe_at)
    resume_steps(module, now, backend=backend)
    wakeup.arm(now)  # a tick now; it arms the next bucket of the spread
    logger.warning("%s marked up by %s", backend_name(module, backend), by, extra=about(module=module, backend=backend))
    return True


def resume_steps(module: str, now: datetime, backend: str = "") -> int:
    """The steps of running runs held by a backend that is up again are due now, and so
    are their runs. Answers how many steps resumed."""
    actions = [a.id for a in registry.actions().values() if a.module == module]
    leases = [lease.id for lease in registry.leases().values() if lease.module == module]
    held = Step.objects.filter(
        Q(action_id__in=actions) | Q(action_id="core.lease", params__lease__in=leases),
        run__status=RunStatus.RUNNING,
        backend=backend,
        status=StepStatus.PENDING,
        next_attempt_at__gt=now,
        waiting_since__isnull=False,
    )
    run_ids = list(held.values_list("run_id", flat=True).distinct())
    if not run_ids:
        return 0
    resumed = held.update(next_attempt_at=now)
    Run.objects.filter(pk__in=run_ids, status=RunStatus.RUNNING, wake_at__gt=now).update(wake_at=now)
    return resumed


def step_module(step: Step) -> str | None:
    """The module a step calls, or None (a built-in wait, an unregistered action)."""
    entry: registry.Action | registry.Lease | None
    if step.action_id == "core.lease":
        lease = (step.params or {}).get("lease")
        entry = registry.get_lease(lease) if isinstance(lease, str) else None
    else:
        entry = registry.get_action(step.action_id)
    return entry.module if entry is not None else None


def step_waits_on(step: Step, now: datetime | None = None) -> ModuleHealth | None:
    """The `ModuleHealth` of the backend a step of a running run waits for, or None."""
    if step.waiting_since is None or step.status != StepStatus.PENDING:
        return None
    return outage_of(step_module(step), now, backend=step.backend)


def _waiting(module: str, backend: str) -> QuerySet[Resource]:
    return Resource.objects.filter(rows.swept(), module=module, backend=backend)


def spread_waiting(module: str, now: datetime, backend: str = "", deferred_until: datetime | None = None) -> int:
    """Let a backend's waiting rows be claimed from now on, a bucket at a time.

    Rows are bucketed by their group (a step's rows by the step), so one step's rows
    resume together and are given back by one call. Rows whose own backoff ends later
    keep it; rows the outage deferred (`defer_waiting`: to the probe due at
    ``deferred_until``, or before) do not wait for that probe any more.
    """
    spread = setting("EVENT_OUTAGE_SPREAD_S")
    waiting = _waiting(module, backend).alias(group=Coalesce("step_id", "id"))
    moved = 0
    for bucket in range(SPREAD_BUCKETS):
        at = now + timedelta(seconds=spread * bucket / SPREAD_BUCKETS)
        moved += rows.resume_at(
            waiting.alias(bucket=Mod("group", SPREAD_BUCKETS)).filter(bucket=bucket), at, deferred_until
        )
    return moved


def down_backends() -> set[tuple[str, str]]:
    """The ``(module, backend)`` pairs that are down now: their work is not attempted."""
    return set(ModuleHealth.objects.down().values_list("module", "backend"))


def down_modules() -> set[str]:
    """The names of the modules with a backend down now."""
    return {module for module, _backend in down_backends()}


def waiting_reasons(keys: Iterable[Any]) -> dict[Any, str]:
    """``{key: "waiting: … is down since …"}`` for those of ``keys`` that are down.

    A key is a module's name (its only backend) or a ``(module, backend)`` pair; the
    answer is keyed as it was asked.
    """
    keys = set(keys)
    pairs = {(k, "") if isinstance(k, str) else tuple(k): k for k in keys}
    modules = {module for module, _backend in pairs}
    down = ModuleHealth.objects.down().filter(module__in=modules)
    return {pairs[(h.module, h.backend)]: h.waiting_text() for h in down if (h.module, h.backend) in pairs}


def waiting_on(keys: Iterable[Iterable[str]]) -> dict[tuple[str, str], ModuleHealth]:
    """``{key: ModuleHealth}`` for those of ``keys`` (``(module, backend)`` pairs) that are
    down now; one query, for a whole page of rows."""
    pairs = {tuple(k) for k in keys}
    down = ModuleHealth.objects.down().filter(module__in={module for module, _backend in pairs})
    return {(h.module, h.backend): h for h in down if (h.module, h.backend) in pairs}


def take_probe(module: str, now: datetime | None = None, backend: str = "") -> bool:
    """Claim the next probe of a down backend; True for the one worker that may make it."""
    now = now or clock.now()
    return bool(
        _rows(module, backend)
        .filter(state=ModuleState.DOWN, next_probe_at__lte=now)
        .update(next_probe_at=now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")))
    )


def health_callable(module: str) -> tuple[Callable[..., Any], object] | tuple[None, None]:
    """The module's ``health()`` callable and its budget owner, or (None, None)."""
    entries: list[registry.Action | registry.Lease] = [*registry.actions().values(), *registry.leases().values()]
    for entry in entries:
        health = getattr(entry, "health", None)
        if entry.module == module and callable(health):
            return health, entry
    return None, None


def ask_health(module: str, backend: str = "") -> tuple[calls.Answer, calls.Reply] | None:
    """Call the module's ``health()`` for one backend; answers ``(answer, reply)`` or None
    when the module has no ``health()``."""
    fn, entry = health_callable(module)
    if fn is None:
        return None
    what = f"{backend_name(module, backend)}.health"
    answer = calls.call(fn, budget_ms=calls.budget_of(entry), what=what, backend=backend, verb="health", module=module)
    return answer, calls.classify_health(answer, what)


def probe(module: str, now: datetime | None = None, backend: str = "") -> str | None:
    """Probe a down backend whose probe is due, when this worker wins the claim.

    Answers "up" (it answered: marked up), "down" (still down), "canary" (no
    ``health()``: the caller may let one ordinary call through, whose answer is recorded
    as any other), or None (not due, or another worker probes). A boot id in the answer
    is noted, so a backend that comes back restarted is reconciled (`note_boot`).
    """
    now = now or clock.now()
    if not take_probe(module, now, backend=backend):
        return None
    holder = _rows(module, backend).filter(held=True).first()
    held = holder is not None and bool(holder.held_at(now))
    asked = ask_health(module, backend)
    if asked is None:
        return "down" if held else "canary"  # no ordinary call into a person's maintenance
    answer, reply = asked
    if held:
        # A person holds it down: say what the probe saw, and leave the backend down.
        seen = f"answers (boot id {reply.value})" if reply.ok and reply.value else "answers" if reply.ok else None
        seen = seen or (blame(answer) or reply.error)
        _rows(module, backend).update(last_probe=seen[:500], last_probe_at=now)
        if reply.ok:
            note_boot(module, backend, reply.value, now)
        return "down"
    if reply.ok:
        mark_up(module, backend=backend, by="probe", now=clock.now())
        note_boot(module, backend, reply.value, now)
        return "up"
    reason = blame(answer) or reply.error
    _rows(module, backend).update(last_error=reason[:2000])
    defer_waiting(module, now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")), backend=backend)
    return "down"


def note_boot(module: str, backend: str, boot_id: object, now: datetime | None = None) -> bool:
    """Keep the boot id a backend's ``health()`` answered; a different one than last time
    is a restart nobody reported: the backend alone owes a reconcile with rule 14's look-back.

    The new boot id and the debt are written in one transaction (`owe_reconcile`): a
    restart whose boot id is kept is never forgotten, whatever becomes of the queued task.
    Answers True when this worker saw the restart (the conditional UPDATE it won).
    """
    now = now or clock.now()
    if not boot_id:
        return False
    health = _health(module, backend)
    if health.boot_id == boot_id:
        return False
    with transaction.atomic():
        changed = _rows(module, backend).filter(boot_id=health.boot_id).update(boot_id=boot_id, updated_at=now)
        if not changed or not health.boot_id:
            return False  # another worker saw it first, or the first boot id ever seen
        owe_reconcile(module, backend, now)
    logger.warning("%s restarted (boot id %s, was %s)", backend_name(module, backend), boot_id, health.boot_id)
    return True


def owe_reconcile(module: str, backend: str = "", now: datetime | None = None) -> None:
    """Record that a backend restarted: it owes a reconcile with rule 14's look-back.

    One UPDATE counts the restart (``restarts_seen``, which names the debt) and keeps the
    oldest time a reconcile has been owed since. Called inside the caller's transaction
    when it writes a boot id too, so both commit or neither does. The tick pays the debt
    (`cleanup.reconcile.pay_owed`); the task queued here, once the transaction commits,
    only hurries it: losing it loses nothing.
    """
    now = now or clock.now()
    _health(module, backend)
    _rows(module, backend).update(
        restarts_seen=F("restarts_seen") + 1,
        reconcile_owed_since=Coalesce("reconcile_owed_since", Value(now)),
        updated_at=now,
    )
    queue_owed_reconcile(module=module, backend=backend)


def restart_reported(sender: object, *, module: str, backend: str = "", **kwargs: object) -> None:
    """`registry.backend_restarted`'s signal: a module says its backend restarted."""
    with transaction.atomic():
        owe_reconcile(module, backend)


def owed(
    now: datetime | None = None, *, module: str | None = None, backend: str | None = None
) -> QuerySet[ModuleHealth]:
    """The backends that owe a reconcile and that no live claim holds, oldest debt first;
    of one module, or one of its backends, when given. A backend that is down keeps its
    debt until it is up: its reconcile would have no answer."""
    now = now or clock.now()
    mine = Q() if module is None else Q(module=module) if backend is None else Q(module=module, backend=backend)
    return (
        ModuleHealth.objects.filter(mine, reconcile_owed_since__isnull=False, state=ModuleState.UP)
        .filter(Q(reconcile_claim_token__isnull=True) | Q(reconcile_claim_expires_at__lt=now))
        .order_by("reconcile_owed_since", "id")
    )


def claim_owed(health: ModuleHealth, token: uuid.UUID, now: datetime | None = None) -> ModuleHealth | None:
    """Take the claim on a backend's owed reconcile for ``token``, unless another holds it.

    Answers the `ModuleHealth` as claimed (its ``restarts_seen`` names the debt this claim
    pays), or None. The claim expires after ``EVENT_CLAIM_TIMEOUT_S``: a ticker that died
    holding it leaves the debt to the next.
    """
    now = now or clock.now()
    taken = (
        owed(now)
        .filter(pk=health.pk)
        .update(reconcile_claim_token=token, reconcile_claim_expires_at=now + timedelta(seconds=claim_timeout_s()))
    )
    if not taken:
        return None
    return ModuleHealth.objects.filter(pk=health.pk, reconcile_claim_token=token).first()


def clear_owed(claimed: ModuleHealth, token: uuid.UUID) -> bool:
    """The reconcile paid for ``claimed`` (as `claim_owed` answered it) has finished: clear
    the debt it named. A restart noticed since then changed ``restarts_seen``: that debt
    stays, and only the claim is let go. Answers whether the debt was cleared."""
    cleared = ModuleHealth.objects.filter(
        pk=claimed.pk, restarts_seen=claimed.restarts_seen, reconcile_owed_since__isnull=False
    ).update(reconcile_owed_since=None, reconcile_claim_token=None, reconcile_claim_expires_at=None)
    if not cleared:
        ModuleHealth.objects.filter(pk=claimed.pk, reconcile_claim_token=token).update(
            reconcile_claim_token=None, reconcile_claim_expires_at=None
        )
    return bool(cleared)


def watched_backends(now: datetime, modules: Iterable[str]) -> set[tuple[str, str]]:
    """The backends of ``modules`` that hold live rows or rows given back within
    ``EVENT_RECONCILE_LOOKBACK_S`` (what a restart could bring back), as pairs."""
    since = now - timedelta(seconds=setting("EVENT_RECONCILE_LOOKBACK_S"))
    rows = Resource.objects.filter(module__in=modules)
    live = rows.filter(state=ResourceState.LIVE).values_list("module", "backend").distinct()
    recent = rows.filter(state=ResourceState.REVERTED, resolved_at__gte=since).values_list("module", "backend")
    return set(live) | set(recent.distinct())


def watch(now: datetime | None = None) -> int:
    """Ask every up backend that holds something for its health, at least every
    ``EVENT_BACKEND_WATCH_S`` and at most every half of it, even when no run is active;
    answers how many were asked.

    One worker asks each backend per interval (a conditional UPDATE of ``watched_at``). An
    answer that blames the backend counts towards its outage like any other; one with a new
    boot id is a restart (`note_boot`). A module without ``health()`` cannot be watched.
    """
    now = now or clock.now()
    watchable = [m for m in registry.modules() if health_callable(m)[0] is not None]
    if not watchable:
        return 0
    # Due once half the interval has passed: ticks come about once a minute, never exactly,
    # so a backend asked at every tick past half of it is never left longer than the whole.
    due_before = now - timedelta(seconds=setting("EVENT_BACKEND_WATCH_S") / 2)
    asked = 0
    for module, backend in sorted(watched_backends(now, watchable)):
        _health(module, backend)
        due = Q(watched_at__isnull=True) | Q(watched_at__lte=due_before)
        if not _rows(module, backend).filter(due, state=ModuleState.UP).update(watched_at=now):
            continue
        health = ask_health(module, backend)
        if health is None:
            continue
        answer, reply = health
        asked += 1
        record(module, blame(answer), backend=backend, key="health", ambiguous=answer.timed_out)
        if reply.ok:
            note_boot(module, backend, reply.value, now)
    return asked


def probe_due_backends(now: datetime | None = None) -> set[tuple[str, str]]:
    """Probe every down backend whose probe is due; answers the backends whose canary may go."""
    now = now or clock.now()
    due = ModuleHealth.objects.down().filter(next_probe_at__lte=now).values_list("module", "backend")
    return {(module, backend) for module, backend in due if probe(module, now, backend=backend) == "canary"}


def probe_due_modules(now: datetime | None = None) -> set[str]:
    """`probe_due_backends`, by module name."""
    return {module for module, _backend in probe_due_backends(now)}


def outages_past_give_up(now: datetime | None = None) -> list[ModuleHealth]:
    """Backends down longer than ``EVENT_OUTAGE_GIVE_UP_S`` whose work is not yet given up.

    Each is answered once per outage (a conditional UPDATE), with its `ModuleHealth`,
    so that the caller fails its waiting work with the reason.
    """
    now = now or clock.now()
    limit = now - timedelta(seconds=setting("EVENT_OUTAGE_GIVE_UP_S"))
    given_up = []
    for health in ModuleHealth.objects.down().filter(down_since__lt=limit, gave_up_at__isnull=True):
        with transaction.atomic():
            if ModuleHealth.objects.filter(pk=health.pk, gave_up_at__isnull=True).update(gave_up_at=now):
                _log(
                    health.module,
                    ModuleEventKind.GAVE_UP,
                    now,
                    backend=health.backend,
                    by="engine",
                    error=health.last_error,
                    down_since=health.down_since.isoformat() if health.down_since else None,
                )
                given_up.append(health)
    return given_up


def give_up_text(health: ModuleHealth) -> str:
    minutes = round(setting("EVENT_OUTAGE_GIVE_UP_S") / 60)
    return (
        f"{health.name} was down for more than {minutes} min, so this was not given back"
        f" (last error: {health.last_error or 'none'})"
    )


def _log(module: str, kind: str, now: datetime, backend: str = "", **detail: Any) -> None:
    ModuleEvent.objects.create(module=module, backend=backend, kind=kind, at=now, detail=detail)


def given_up(health: ModuleHealth, now: datetime) -> bool:
    """Has this outage lasted past ``EVENT_OUTAGE_GIVE_UP_S``? Then work stops waiting on it."""
    return health.down_since is not None and health.down_since < now - timedelta(
        seconds=setting("EVENT_OUTAGE_GIVE_UP_S")
    )


def outage_of(module: str | None, now: datetime | None = None, backend: str = "") -> ModuleHealth | None:
    """The `ModuleHealth` of a module's backend while its work waits on it, else None.

    None when the backend is up, unknown, or down for longer than the give-up bound.
    """
    if not module:
        return None
    health: ModuleHealth | None = ModuleHealth.objects.down().filter(module=module, backend=backend).first()
    if health is None or given_up(health, now or clock.now()):
        return None
    return health


def hold(module: str | None, now: datetime | None = None, backend: str = "") -> datetime | None:
    """None when a call to a module's backend may be made now; else when to look again.

    A down backend is probed here when its probe is due: a probe that finds it up, or a
    canary this caller may make, lets the call through.
    """
    now = now or clock.now()
    health = outage_of(module, now, backend=backend)
    if health is None or not module:
        return None
    if probe(module, now, backend=backend) in ("up", "canary"):
        return None
    next_probe = ModuleHealth.objects.filter(pk=health.pk).values_list("next_probe_at", flat=True).first()
    return next_probe or now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S"))


def call(
    entry: Any, fn: Callable[..., Any], *, budget_ms: int, what: str, backend: str = "", **kwargs: Any
) -> calls.Answer:
    """`calls.call`, with the answer counted towards the health of ``entry``'s module's backend."""
    answer = calls.call(fn, budget_ms=budget_ms, what=what, backend=backend, module=entry.module, **kwargs)
    record(entry.module, blame(answer), backend=backend, key=what, ambiguous=answer.timed_out)
    return answer


def known_modules() -> list[str]:
    """Every registered module and every module with a health row, by name: what people see."""
    return sorted(set(registry.modules()) | set(ModuleHealth.objects.values_list("module", flat=True)))


def module_known(module: str) -> bool:
    """A module a person may mark up or down: registered, with a health row, or owning ledger rows."""
    if "\x00" in module:
        return False
    return (
        module in registry.modules()
        or ModuleHealth.objects.filter(module=module).exists()
        or Resource.objects.filter(module=module).exists()
    )


def health_rows(modules: Iterable[str]) -> dict[str, ModuleHealth]:
    """``{module: ModuleHealth}`` of each of ``modules``' only backend (``""``), unsaved
    rows (up) for those never seen."""
    found = {h.module: h for h in ModuleHealth.objects.filter(module__in=set(modules), backend="")}
    return {m: found.get(m) or ModuleHealth(module=m) for m in modules}


def backends_of(modules: Iterable[str]) -> dict[str, list[ModuleHealth]]:
    """``{module: [ModuleHealth, ...]}``: each backend of each module that has a health row
    or unresolved ledger rows; a module of which none is known has its only backend ``""``
    (an unsaved row, up). The ledger is read through its unresolved rows only, never its whole history: the
    pages that list backends promise as much."""
    modules = set(modules)
    found = {(h.module, h.backend): h for h in ModuleHealth.objects.filter(module__in=modules)}
    ledgered = (
        Resource.objects.filter(module__in=modules, state__in=UNRESOLVED)
        .order_by()
        .values_list("module", "backend")
        .distinct()
    )
    keys = set(found) | set(ledgered)
    # A module's only backend ``""`` is listed (up, never seen) when nothing else is known of
    # it; a fleet module that never named ``""`` gets no row for it.
    keys |= {(m, "") for m in modules if not any(key[0] == m for key in keys)}
    answer: dict[str, list[ModuleHealth]] = {m: [] for m in modules}
    for module, backend in sorted(keys):
        answer[module].append(found.get((module, backend)) or ModuleHealth(module=module, backend=backend))
    return answer


def defer_waiting(module: str, until: datetime | None, run_ids: Iterable[int] | None = None, backend: str = "") -> int:
    """Keep a backend's claimable rows out of the sweep until ``until`` (its next probe).

    That is how its work waits: the finder and the claim pass over rows whose next
    attempt is later, so a down backend's runs take no place in a pass. The probe that
    finds it up brings them back (`spread_waiting`).
    """
    waiting = _waiting(module, backend)
    if run_ids is not None:
        waiting = waiting.filter(run_id__in=run_ids)
    return rows.defer(waiting, until)


def waiting_until(module: str | None, now: datetime | None = None, backend: str = "") -> datetime | None:
    """When a backend's waiting work is looked at again, if its work waits on it; else None."""
    health = outage_of(module, now, backend=backend)
    if health is None:
        return None
    return health.next_probe_at or (now or clock.now()) + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S"))


def give_up_waiting(health: ModuleHealth, now: datetime | None = None) -> list[int]:
    """An outage past its bound: the backend's waiting rows fail for good, with the reason.

    Answers the ids of the runs concerned, whose statuses the caller refreshes.
    """
    now = now or clock.now()
    waiting = _waiting(health.module, health.backend).filter(rows.in_automatic_sweep())
    run_ids = sorted(set(waiting.values_list("run_id", flat=True).distinct()))
    reason = give_up_text(health)
    with transaction.atomic():
        rows.give_up(waiting, reason, now)
        RunLog.objects.bulk_create(
            RunLog(run_id=run_id, kind=LogKind.CLEANUP_FAILED, at=now, detail={"what": health.name, "error": reason})
            for run_id in run_ids
        )
    return run_ids


def troubled() -> Q:
    """A backend's health row that a pass must know: down, or answers blaming it not yet ended."""
    return Q(state=ModuleState.DOWN) | Q(failures_in_row__gt=0)


class Snapshot:
    """What one pass knows of its modules' backends' health, read once, so a pass whose
    backends are all well spends one query on it, whatever its number of calls.

    Keyed by ``(module, backend)``.
    """

    def __init__(self, rows: Iterable[ModuleHealth] | None = None) -> None:
        """Read now, or from ``rows`` (the health rows `troubled` selects, read by the caller:
        none at all when the caller's own read found that no backend is troubled)."""
        rows = ModuleHealth.objects.filter(troubled()) if rows is None else rows
        self.rows = {(h.module, h.backend): h for h in rows}
        self.troubled = set(self.rows)  # down, or answers blaming the backend not yet ended
        self.down = {key for key, h in self.rows.items() if h.state == ModuleState.DOWN}

    def record(
        self, module: str, reason: str | None, *, backend: str = "", key: str = "", ambiguous: bool = False
    ) -> bool:
        """`record`, skipped for a well backend's success: there is nothing to end."""
        pair = (module, backend)
        if reason is None and pair not in self.troubled:
            return False
        if reason is None:
            self.troubled.discard(pair)
            self.down.discard(pair)
        else:
            self.troubled.add(pair)
        return record(module, reason, backend=backend, key=key, ambiguous=ambiguous)

    def before_pass(self, now: datetime) -> tuple[set[tuple[str, str]], list[ModuleHealth]]:
        """Probe the down backends whose probe is due and end the outages past their bound.

        Answers ``(canaries, given_up)``: the ``(module, backend)`` pairs that may have one
        ordinary call, and the `ModuleHealth` of each outage whose waiting work must now fail.
        """
        limit = now - timedelta(seconds=setting("EVENT_OUTAGE_GIVE_UP_S"))
        given_up = []
        if any(h.down_since and h.down_since < limit and h.gave_up_at is None for h in self.rows.values()):
            given_up = outages_past_give_up(now)
        canaries = set()
        for pair in sorted(self.down):
            health = self.rows[pair]
            if health.next_probe_at is None or health.next_probe_at > now:
                continue
            verdict = probe(pair[0], now, backend=pair[1])
            if verdict == "up":
                self.down.discard(pair)
                self.troubled.discard(pair)
            elif verdict == "canary":
                canaries.add(pair)
        return canaries, given_up
