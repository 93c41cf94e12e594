"""A module's backend is down: its work waits, and spends no attempts, until it answers.

Attempts exist to stop a row that cannot be given back from being tried for ever, not to
count the minutes a shard spent restarting. So the engine tells an answer that blames the
backend (no answer within the budget, a backend that could not be reached, an envelope
with ``"unavailable": true``) from an answer about the row, and counts the former per
module, across rows and runs. ``EVENT_OUTAGE_AFTER`` of them in a row mark the module
down; its rows and steps are then not attempted, and the answers that led to it are
forgiven (their attempts are given back to the rows).

While a module is down, one probe at a time is let through at most every
``EVENT_OUTAGE_PROBE_S``: the module's ``health()`` when one of its actions or leases has
it, else one ordinary call (a canary). Any answer that does not blame the backend marks
the module up, and its waiting rows are spread over ``EVENT_OUTAGE_SPREAD_S`` seconds so a
recovering shard is not hit by all of them at once. An outage longer than
``EVENT_OUTAGE_GIVE_UP_S`` ends the wait: the caller fails the waiting work with the
reason, and nothing waits silently for ever.

The state lives in `ModuleHealth`, so every sweeper and ticker shares it; every change is
a conditional UPDATE, and only the worker whose UPDATE changed the row logs the change.
May import: the models, conf, `calls`, `registry`. Imported by the runner and the pass.
"""

import logging
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, F, OuterRef, Q, Subquery
from django.db.models.functions import Mod
from django.utils import timezone

from . import calls, registry
from .conf import setting
from .models import (
    CLAIMABLE,
    TERMINAL,
    Attempt,
    AttemptOutcome,
    LogKind,
    ModuleEvent,
    ModuleEventKind,
    ModuleHealth,
    ModuleState,
    Resource,
    ResourceState,
    RunLog,
)

logger = logging.getLogger(__name__)

# The outcome an attempt is recorded with when its answer blamed the backend.
UNAVAILABLE = AttemptOutcome.UNAVAILABLE
SPREAD_BUCKETS = 10


def blame(answer):
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


def _health(module):
    """The module's row, made on first need (two workers racing make one)."""
    try:
        with transaction.atomic():
            return ModuleHealth.objects.get_or_create(module=module)[0]
    except IntegrityError:
        return ModuleHealth.objects.get(module=module)


def record(module, reason, *, key="", ambiguous=False, now=None):
    """Count one answer from ``module``; ``reason`` is what `blame` said of it.

    Answers True when this answer marked the module down. An answer that does not blame
    the backend ends a run of failures, and marks a down module up: it answered.

    ``ambiguous`` (no answer within the budget) may be the call's own fault, a poison
    pill that hangs whatever the backend: such an answer for ``key`` (the group called)
    counts only when the last one counted was for another key, so one group that hangs
    again and again never marks its module down; it spends its attempts like any row.
    """
    now = now or timezone.now()
    if reason is None:
        ModuleHealth.objects.filter(module=module, failures_in_row__gt=0).update(
            failures_in_row=0, streak_started_at=None, updated_at=now
        )
        if ModuleHealth.objects.filter(module=module, state=ModuleState.DOWN).exists():
            mark_up(module, by="engine", now=now)
        return False
    _health(module)
    counted = ModuleHealth.objects.filter(module=module)
    if ambiguous and key:
        counted = counted.exclude(last_blamed_key=key)
    ModuleHealth.objects.filter(module=module, failures_in_row=0).update(streak_started_at=now)
    if not counted.update(
        failures_in_row=F("failures_in_row") + 1, last_error=reason[:2000], last_blamed_key=key[:500], updated_at=now
    ):
        return False
    return _mark_down_after_streak(module, now)


def _mark_down_after_streak(module, now):
    with transaction.atomic():
        marked = ModuleHealth.objects.filter(
            module=module, state=ModuleState.UP, failures_in_row__gte=setting("EVENT_OUTAGE_AFTER")
        ).update(
            state=ModuleState.DOWN,
            down_since=now,
            gave_up_at=None,
            changed_by="engine",
            next_probe_at=now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")),
            updated_at=now,
        )
        if not marked:
            return False
        health = ModuleHealth.objects.get(module=module)
        forgiven = forgive_streak(health)
        defer_waiting(module, health.next_probe_at)
        _log(
            module,
            ModuleEventKind.DOWN,
            now,
            by="engine",
            error=health.last_error,
            failures=health.failures_in_row,
            forgiven=forgiven,
        )
    logger.warning("module %s marked down: %s", module, health.last_error)
    return True


def forgive_streak(health):
    """Give back the attempts that the answers leading to an outage spent.

    Those answers blamed the backend: the rows were not at fault. Each row gets back the
    number of its attempts the streak spent.
    """
    if health.streak_started_at is None:
        return 0
    spent = (
        Attempt.objects.filter(resource=OuterRef("pk"), outcome=UNAVAILABLE, at__gte=health.streak_started_at)
        .values("resource")
        .annotate(n=Count("id"))
        .values("n")
    )
    # A row held by a sweeper right now counts too: its verdict gives back only the
    # attempt of its own claim, never these.
    open_states = (*CLAIMABLE, ResourceState.REVERTING)
    rows = Resource.objects.filter(
        module=health.module,
        state__in=open_states,
        retryable=True,
        revert_attempts__gt=0,
        attempts__outcome=UNAVAILABLE,
        attempts__at__gte=health.streak_started_at,
    ).distinct()
    ids = list(rows.values_list("id", flat=True))
    if not ids:
        return 0
    return Resource.objects.filter(pk__in=ids, state__in=open_states).update(
        revert_attempts=F("revert_attempts") - Subquery(spent), next_attempt_at=None
    )


def mark_down(module, *, by, reason="", now=None):
    """A person marks ``module`` down; answers whether it changed."""
    now = now or timezone.now()
    _health(module)
    with transaction.atomic():
        marked = ModuleHealth.objects.filter(module=module, state=ModuleState.UP).update(
            state=ModuleState.DOWN,
            down_since=now,
            gave_up_at=None,
            changed_by=by,
            last_error=reason or f"marked down by {by}",
            next_probe_at=now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")),
            updated_at=now,
        )
        if marked:
            defer_waiting(module, now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")))
            _log(module, ModuleEventKind.DOWN, now, by=by, error=reason or f"marked down by {by}")
    return bool(marked)


def mark_up(module, *, by, now=None):
    """Mark ``module`` up (a person, or an answer that proved it); answers whether it changed.

    Its waiting rows resume at once, spread over ``EVENT_OUTAGE_SPREAD_S``.
    """
    now = now or timezone.now()
    with transaction.atomic():
        health = ModuleHealth.objects.select_for_update().filter(module=module, state=ModuleState.DOWN).first()
        if health is None:
            return False
        ModuleHealth.objects.filter(pk=health.pk).update(
            state=ModuleState.UP,
            failures_in_row=0,
            streak_started_at=None,
            next_probe_at=None,
            changed_by=by,
            updated_at=now,
        )
        down_for = (now - health.down_since).total_seconds() if health.down_since else None
        _log(module, ModuleEventKind.UP, now, by=by, down_for_s=down_for, last_error=health.last_error)
    spread_waiting(module, now)
    logger.warning("module %s marked up by %s", module, by)
    return True


def spread_waiting(module, now):
    """Let ``module``'s waiting rows be claimed from now on, a bucket at a time.

    Rows whose own backoff ends later keep it.
    """
    spread = setting("EVENT_OUTAGE_SPREAD_S")
    waiting = Resource.objects.filter(module=module, state__in=CLAIMABLE, retryable=True)
    moved = 0
    for bucket in range(SPREAD_BUCKETS):
        at = now + timedelta(seconds=spread * bucket / SPREAD_BUCKETS)
        moved += (
            waiting.alias(bucket=Mod("id", SPREAD_BUCKETS))
            .filter(bucket=bucket)
            .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=at))
            .update(next_attempt_at=at)
        )
    return moved


def down_modules():
    """The names of the modules that are down now: their work is not attempted."""
    return set(ModuleHealth.objects.down().values_list("module", flat=True))


def waiting_reasons(modules):
    """``{module: "waiting: … is down since …"}`` for those of ``modules`` that are down."""
    return {h.module: h.waiting_text() for h in ModuleHealth.objects.down().filter(module__in=set(modules))}


def take_probe(module, now=None):
    """Claim the next probe of a down module; True for the one worker that may make it."""
    now = now or timezone.now()
    return bool(
        ModuleHealth.objects.filter(module=module, state=ModuleState.DOWN, next_probe_at__lte=now).update(
            next_probe_at=now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S"))
        )
    )


def health_callable(module):
    """The module's ``health()`` callable and its budget owner, or (None, None)."""
    for entry in [*registry.actions().values(), *registry.leases().values()]:
        if entry.module == module and callable(getattr(entry, "health", None)):
            return entry.health, entry
    return None, None


def probe(module, now=None):
    """Probe a down module whose probe is due, when this worker wins the claim.

    Answers "up" (it answered: marked up), "down" (still down), "canary" (no
    ``health()``: the caller may let one ordinary call through, whose answer is recorded
    as any other), or None (not due, or another worker probes).
    """
    now = now or timezone.now()
    if not take_probe(module, now):
        return None
    fn, entry = health_callable(module)
    if fn is None:
        return "canary"
    answer = calls.call(fn, budget_ms=calls.budget_of(entry), what=f"{module}.health")
    if isinstance(answer.raw, dict) and answer.raw.get("ok") is True:
        mark_up(module, by="probe", now=timezone.now())
        return "up"
    reason = blame(answer) or answer.exception or _refusal(answer.raw, module)
    ModuleHealth.objects.filter(module=module).update(last_error=reason[:2000])
    defer_waiting(module, now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S")))
    return "down"


def _refusal(raw, module):
    error = raw.get("error") if isinstance(raw, dict) else None
    if isinstance(error, str) and error.strip():
        return error.strip()
    return f"{module}.health answered without ok: true"


def probe_due_modules(now=None):
    """Probe every down module whose probe is due; answers the modules whose canary may go."""
    now = now or timezone.now()
    due = ModuleHealth.objects.down().filter(next_probe_at__lte=now).values_list("module", flat=True)
    return {module for module in due if probe(module, now) == "canary"}


def outages_past_give_up(now=None):
    """Modules down longer than ``EVENT_OUTAGE_GIVE_UP_S`` whose work is not yet given up.

    Each is answered once per outage (a conditional UPDATE), with its `ModuleHealth`,
    so that the caller fails its waiting work with the reason.
    """
    now = now or timezone.now()
    limit = now - timedelta(seconds=setting("EVENT_OUTAGE_GIVE_UP_S"))
    given_up = []
    for health in ModuleHealth.objects.down().filter(down_since__lt=limit, gave_up_at__isnull=True):
        with transaction.atomic():
            if ModuleHealth.objects.filter(pk=health.pk, gave_up_at__isnull=True).update(gave_up_at=now):
                _log(
                    health.module,
                    ModuleEventKind.GAVE_UP,
                    now,
                    by="engine",
                    error=health.last_error,
                    down_since=health.down_since.isoformat(),
                )
                given_up.append(health)
    return given_up


def give_up_text(health):
    minutes = round(setting("EVENT_OUTAGE_GIVE_UP_S") / 60)
    return (
        f"{health.module} was down for more than {minutes} min, so this was not given back"
        f" (last error: {health.last_error or 'none'})"
    )


def _log(module, kind, now, **detail):
    ModuleEvent.objects.create(module=module, kind=kind, at=now, detail=detail)


def given_up(health, now):
    """Has this outage lasted past ``EVENT_OUTAGE_GIVE_UP_S``? Then work stops waiting on it."""
    return health.down_since is not None and health.down_since < now - timedelta(
        seconds=setting("EVENT_OUTAGE_GIVE_UP_S")
    )


def outage_of(module, now=None):
    """The `ModuleHealth` of ``module`` while its work waits on it, else None.

    None when the module is up, unknown, or down for longer than the give-up bound.
    """
    if not module:
        return None
    health = ModuleHealth.objects.down().filter(module=module).first()
    if health is None or given_up(health, now or timezone.now()):
        return None
    return health


def hold(module, now=None):
    """None when a call to ``module`` may be made now; else when to look again.

    A down module is probed here when its probe is due: a probe that finds it up, or a
    canary this caller may make, lets the call through.
    """
    now = now or timezone.now()
    health = outage_of(module, now)
    if health is None:
        return None
    if probe(module, now) in ("up", "canary"):
        return None
    next_probe = ModuleHealth.objects.filter(pk=health.pk).values_list("next_probe_at", flat=True).first()
    return next_probe or now + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S"))


def call(entry, fn, *, budget_ms, what, **kwargs):
    """`calls.call`, with the answer counted towards ``entry``'s module's health."""
    answer = calls.call(fn, budget_ms=budget_ms, what=what, **kwargs)
    record(entry.module, blame(answer), key=what, ambiguous=answer.timed_out)
    return answer


def known_modules():
    """Every registered module and every module with a health row, by name: what people see."""
    return sorted(set(registry.modules()) | set(ModuleHealth.objects.values_list("module", flat=True)))


def module_known(module):
    """A module a person may mark up or down: registered, with a health row, or owning ledger rows."""
    if "\x00" in module:
        return False
    return (
        module in registry.modules()
        or ModuleHealth.objects.filter(module=module).exists()
        or Resource.objects.filter(module=module).exists()
    )


def health_rows(modules):
    """``{module: ModuleHealth}`` for each of ``modules``, unsaved rows (up) for those never seen."""
    found = {h.module: h for h in ModuleHealth.objects.filter(module__in=set(modules))}
    return {m: found.get(m) or ModuleHealth(module=m) for m in modules}


def row_waits(row, max_attempts):
    """Would the sweep attempt this ledger row now, were its module up? Only such a row waits on it.

    Reads ``row.run``: select it with the row.
    """
    return (
        row.state in CLAIMABLE
        and row.retryable
        and row.revert_attempts < max_attempts
        and row.run.is_terminal
        and row.run.auto_cleanup
    )


def defer_waiting(module, until, run_ids=None):
    """Keep ``module``'s claimable rows out of the sweep until ``until`` (its next probe).

    That is how its work waits: the finder and the claim pass over rows whose next
    attempt is later, so a down module's runs take no place in a pass. The probe that
    finds the module up brings them back (`spread_waiting`).
    """
    rows = Resource.objects.filter(module=module, state__in=CLAIMABLE, retryable=True)
    if run_ids is not None:
        rows = rows.filter(run_id__in=run_ids)
    return rows.filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=until)).update(next_attempt_at=until)


def waiting_until(module, now=None):
    """When ``module``'s waiting work is looked at again, if its work waits on it; else None."""
    health = outage_of(module, now)
    if health is None:
        return None
    return health.next_probe_at or (now or timezone.now()) + timedelta(seconds=setting("EVENT_OUTAGE_PROBE_S"))


def give_up_waiting(health, now=None):
    """An outage past its bound: the module's waiting rows fail for good, with the reason.

    Answers the ids of the runs concerned, whose statuses the caller refreshes.
    """
    now = now or timezone.now()
    rows = Resource.objects.filter(
        module=health.module, state__in=CLAIMABLE, retryable=True, run__status__in=TERMINAL, run__auto_cleanup=True
    )
    run_ids = sorted(set(rows.values_list("run_id", flat=True).distinct()))
    reason = give_up_text(health)
    with transaction.atomic():
        Resource.objects.filter(pk__in=rows.values("pk")).update(
            state=ResourceState.FAILED, retryable=False, last_error=reason, next_attempt_at=None, updated_at=now
        )
        RunLog.objects.bulk_create(
            RunLog(run_id=run_id, kind=LogKind.CLEANUP_FAILED, at=now, detail={"what": health.module, "error": reason})
            for run_id in run_ids
        )
    return run_ids


class Snapshot:
    """What one pass knows of its modules' health, read once, so a pass whose modules are
    all well spends one query on it, whatever its number of calls."""

    def __init__(self):
        rows = ModuleHealth.objects.filter(Q(state=ModuleState.DOWN) | Q(failures_in_row__gt=0))
        self.rows = {h.module: h for h in rows}
        self.troubled = set(self.rows)  # down, or answers blaming the backend not yet ended
        self.down = {m for m, h in self.rows.items() if h.state == ModuleState.DOWN}

    def record(self, module, reason, *, key="", ambiguous=False):
        """`record`, skipped for a well module's success: there is nothing to end."""
        if reason is None and module not in self.troubled:
            return False
        if reason is None:
            self.troubled.discard(module)
            self.down.discard(module)
        else:
            self.troubled.add(module)
        return record(module, reason, key=key, ambiguous=ambiguous)

    def before_pass(self, now):
        """Probe the down modules whose probe is due and end the outages past their bound.

        Answers ``(canaries, given_up)``: the modules that may have one ordinary call,
        and the `ModuleHealth` of each outage whose waiting work must now fail.
        """
        limit = now - timedelta(seconds=setting("EVENT_OUTAGE_GIVE_UP_S"))
        given_up = []
        if any(h.down_since and h.down_since < limit and h.gave_up_at is None for h in self.rows.values()):
            given_up = outages_past_give_up(now)
        canaries = set()
        for module in sorted(self.down):
            health = self.rows[module]
            if health.next_probe_at is None or health.next_probe_at > now:
                continue
            verdict = probe(module, now)
            if verdict == "up":
                self.down.discard(module)
                self.troubled.discard(module)
            elif verdict == "canary":
                canaries.add(module)
        return canaries, given_up
