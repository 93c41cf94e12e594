"""The dead-man's switch: the core's session with each backend that can give back by itself (rule 34).

A module may declare ``keepalive(*, backend, session, ttl_s)`` (on any one of its actions
or leases, as it may ``health``). The engine then keeps one session per backend of that
module, in the database (`DeadmanSwitch`), and renews it at least every third of
``EVENT_DEADMAN_TTL_S`` from the tick and from a schedule of its own (`cleanup.tasks`),
never from a request. ``perform`` and ``apply`` of such a module are told the session
(``session=...``, when they name that keyword) once the backend has taken it, and the
backend files what they take under it. A backend that hears no renewal for ``ttl_s`` gives
back everything filed under the session, by itself, and remembers that it did: the core's
first renewal after that (or the one a reconcile makes first) hears which ledger refs it
gave back and which it could not, and `record_lapse` writes them: those rows end
``reverted`` with the switch's reason and are never called again, the ones it kept stay
``failed`` with its reason, the lapse is logged on each run it touched and told to staff
once (a ``module.lapsed`` event), and the runs still running there are answered to the
runner, which aborts them (`Renewal.abort`). A new session replaces the lapsed one.

A renewal is a module call like any other, under its budget and counted towards the
backend's outage (`cleanup.outages.call`). ``EVENT_DEADMAN_TTL_S`` of 0 turns the switch
off: no session is kept, renewed or sent, and modules work as without one.
May import: the models, conf, `clock`, `calls`, `registry`, `cleanup.rows`, `outages` and the pass's
`statuses`.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import calls, clock, outages, registry, rows
from .conf import setting
from .models import (
    STEP_KIND,
    UNRESOLVED,
    DeadmanSwitch,
    LogKind,
    ModuleEvent,
    ModuleEventKind,
    Resource,
    Run,
    RunLog,
    RunStatus,
    backend_name,
)
from .sweep import statuses

logger = logging.getLogger(__name__)

# Renewals per ttl: a renewal that fails can be made again twice before the backend lets go.
RENEWALS_PER_TTL = 3


def ttl_s() -> int:
    """``EVENT_DEADMAN_TTL_S`` now; 0 when the switch is off."""
    value: int = setting("EVENT_DEADMAN_TTL_S")
    return value


def renew_every(ttl: int) -> timedelta:
    """How long a renewal lasts before the next is due: a third of the ttl."""
    return timedelta(seconds=ttl / RENEWALS_PER_TTL)


def keepalive_of(module: str | None) -> tuple[Callable[..., object] | None, registry.Action | registry.Lease | None]:
    """The module's ``keepalive`` callable and the entry that carries it, or ``(None, None)``."""
    entries: list[registry.Action | registry.Lease] = [*registry.actions().values(), *registry.leases().values()]
    for entry in entries:
        fn = getattr(entry, "keepalive", None)
        if entry.module == module and callable(fn):
            return fn, entry
    return None, None


def takes_session(fn: Callable[..., object]) -> bool:
    """Does the callable take a ``session`` keyword (by name, or ``**kwargs``)? Only then is
    it told the session."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "session" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) or p.kind == p.VAR_KEYWORD
        for p in parameters
    )


@dataclass
class Renewal:
    """What one renewal came to: renewed, or not (``error``), and a lapse recorded by it."""

    switch: DeadmanSwitch
    renewed: bool = False
    error: str = ""
    lapsed: bool = False
    reason: str = ""
    # Runs still running on the backend when it let go: the runner aborts them, with ``reason``.
    abort: list[int] = field(default_factory=list)


# -- the session ---------------------------------------------------------------------------


def switch_of(module: str, backend: str = "") -> DeadmanSwitch:
    """The backend's switch row, made on first need (two workers racing make one)."""
    try:
        with transaction.atomic():
            return DeadmanSwitch.objects.get_or_create(module=module, backend=backend)[0]
    except IntegrityError:
        return DeadmanSwitch.objects.get(module=module, backend=backend)


def due(switch: DeadmanSwitch, now: datetime, ttl: int) -> bool:
    """Is a renewal due: never taken, told another ttl, or a third of the ttl old?"""
    return switch.renewed_at is None or switch.ttl_s != ttl or switch.renewed_at <= now - renew_every(ttl)


def prepare(module: str | None, backend: str = "", now: datetime | None = None) -> Renewal | None:
    """Before a step acts on a backend: its session made and renewed if a renewal is due.

    None when the switch is off or the module has no ``keepalive``. A renewal that finds
    the session lapsed has recorded it; the runs to abort are in its answer.
    """
    ttl = ttl_s()
    if not ttl or module is None or keepalive_of(module)[0] is None:
        return None
    switch = switch_of(module, backend)
    if not due(switch, now or clock.now(), ttl):
        return Renewal(switch=switch, renewed=True)
    return renew(switch)


def session_kwargs(module: str | None, backend: str, fn: Callable[..., object]) -> dict[str, str]:
    """``{"session": ...}`` for a ``perform`` or ``apply`` that takes it, when the backend has
    taken the session; else nothing (a module without ``keepalive``, the switch off, a
    backend that has not answered a renewal)."""
    if not ttl_s() or module is None or keepalive_of(module)[0] is None or not takes_session(fn):
        return {}
    switch = DeadmanSwitch.objects.filter(module=module, backend=backend, armed_at__isnull=False).first()
    return {"session": str(switch.session)} if switch is not None else {}


def renew(switch: DeadmanSwitch, again: bool = True) -> Renewal:
    """Renew one backend's session: one ``keepalive`` call, counted towards its outage.

    A session the backend says lapsed is recorded (`record_lapse`) and replaced by a new
    one, which is renewed at once so that the backend holds a live session again.
    """
    ttl = ttl_s()
    fn, entry = keepalive_of(switch.module)
    if fn is None or not ttl:
        return Renewal(switch=switch, error="no keepalive")
    what = f"{backend_name(switch.module, switch.backend)}.keepalive"
    answer = outages.call(
        entry,
        fn,
        budget_ms=calls.budget_of(entry),
        what=what,
        backend=switch.backend,
        verb="keepalive",
        session=str(switch.session),
        ttl_s=ttl,
    )
    reply = calls.classify_keepalive(answer, what)
    now = clock.now()
    if not reply.ok:
        DeadmanSwitch.objects.filter(pk=switch.pk, session=switch.session).update(
            last_error=reply.error[:2000], updated_at=now
        )
        logger.warning("%s failed: %s", what, reply.error)
        return Renewal(switch=switch, error=reply.error)
    if isinstance(reply.value, dict):
        renewal = record_lapse(switch, reply.value, now)
        switch.refresh_from_db()
        # The new session, at once; only once, whatever a module answers to it.
        fresh = renew(switch, again=False) if renewal.lapsed and again else Renewal(switch=switch)
        renewal.switch, renewal.renewed, renewal.error = fresh.switch, fresh.renewed, fresh.error
        return renewal
    DeadmanSwitch.objects.filter(pk=switch.pk, session=switch.session).update(
        renewed_at=now, ttl_s=ttl, last_error="", updated_at=now, armed_at=switch.armed_at or now
    )
    switch.refresh_from_db()
    return Renewal(switch=switch, renewed=True)


def renew_due(now: datetime | None = None) -> list[Renewal]:
    """Renew every session due (`due`); answers what each renewal came to."""
    ttl = ttl_s()
    if not ttl:
        return []
    now = now or clock.now()
    stale = Q(renewed_at__isnull=True) | Q(renewed_at__lte=now - renew_every(ttl)) | ~Q(ttl_s=ttl)
    answers = []
    for switch in DeadmanSwitch.objects.filter(stale).order_by("renewed_at", "id"):
        if keepalive_of(switch.module)[0] is None:
            continue  # a module no longer installed: nothing to renew it with
        answers.append(renew(switch))
    return answers


def next_due(now: datetime | None = None) -> datetime | None:
    """When the next renewal falls due, or None when no session is kept."""
    ttl = ttl_s()
    if not ttl:
        return None
    oldest = DeadmanSwitch.objects.order_by("renewed_at").values_list("renewed_at", flat=True).first()
    if oldest is None and not DeadmanSwitch.objects.exists():
        return None
    return (oldest + renew_every(ttl)) if oldest is not None else (now or clock.now())


# The keepalive schedule runs every minute, and django-q2's scheduler looks every 30 s.
SCHEDULE_EVERY_S = 60


def needs_loop() -> bool:
    """Is a renewal due more often than the minute schedule can make it?"""
    ttl = ttl_s()
    return bool(ttl) and renew_every(ttl).total_seconds() < SCHEDULE_EVERY_S


def hold_loop(token: uuid.UUID, until: datetime, now: datetime | None = None) -> bool:
    """Take or keep the renewal loop's hold on the sessions, until ``until``: one UPDATE
    marks ``token``'s every session no other loop holds now. Answers whether this loop holds
    any. So at most one loop renews however many keepalive tasks start one, a loop that
    died is replaced once its hold runs out, and a renewal by somebody else (the tick, a
    reconcile) never stops the loop: it goes on to the session's next due time."""
    now = now or clock.now()
    free = Q(loop_until__isnull=True) | Q(loop_until__lt=now) | Q(loop_token=token)
    return DeadmanSwitch.objects.filter(free).update(loop_token=token, loop_until=until) > 0


# -- a lapse -------------------------------------------------------------------------------


def reason_of(switch: DeadmanSwitch, lapse: dict[str, Any], ttl: int) -> str:
    """The sentence staff read: whose switch, when, and how long it heard nothing."""
    at = parse_datetime(lapse["at"]) if isinstance(lapse.get("at"), str) else None
    when = f" at {timezone.localtime(at).strftime('%H:%M')}" if at is not None else ""
    silent = lapse.get("silent_s")
    seconds = round(silent) if isinstance(silent, int | float) else ttl
    return f"given back by {switch.name}'s own switch{when}: no word from the core for {seconds} s"


def record_lapse(switch: DeadmanSwitch, lapse: dict[str, Any], now: datetime) -> Renewal:
    """The backend's switch went off: replace the session (the one worker whose UPDATE
    names the lapsed session records it), settle the rows it gave back or kept
    (`rows.given_back_by_switch`), log it on each run touched, and tell staff once."""
    ttl = ttl_s() or switch.ttl_s
    reason = reason_of(switch, lapse, ttl)
    given, kept = list(lapse["given_back"]), dict(lapse["kept"])
    won = DeadmanSwitch.objects.filter(pk=switch.pk, session=switch.session).update(
        session=uuid.uuid4(),
        armed_at=None,
        renewed_at=None,
        lapses=switch.lapses + 1,
        last_lapse_at=now,
        last_lapse_reason=reason,
        last_lapse_given_back=len(given),
        last_lapse_kept=len(kept),
        updated_at=now,
    )
    if not won:
        return Renewal(switch=switch)  # another worker heard the same lapse first
    on_backend = Resource.objects.filter(module=switch.module, backend=switch.backend)
    reverted, failed = rows.given_back_by_switch(on_backend, given, kept, reason, now)
    touched = {r.run_id for r in [*reverted, *failed]}
    running = _running_on(switch)
    for run_id in sorted(touched | set(running)):
        mine = [r for r in reverted if r.run_id == run_id and r.kind != STEP_KIND]
        RunLog.write(
            run_id,
            LogKind.BACKEND_LAPSED,
            backend=switch.name,
            reason=reason,
            given_back=[f"{r.kind}:{r.ref}" for r in mine],
            kept={f"{r.kind}:{r.ref}": kept[r.ref] for r in failed if r.run_id == run_id},
        )
    ended = list(Run.objects.filter(pk__in=touched).exclude(status=RunStatus.RUNNING).values_list("id", flat=True))
    if ended:
        statuses.refresh_statuses(ended)
    ModuleEvent.objects.create(
        module=switch.module,
        backend=switch.backend,
        kind=ModuleEventKind.LAPSED,
        at=now,
        detail={
            "by": f"{switch.name}'s switch",
            "error": reason,
            "given_back": len(given),
            "kept": len(kept),
            "runs": sorted(touched | set(running)),
        },
    )
    logger.warning("%s (%s given back, %s kept)", reason, len(given), len(kept))
    return Renewal(switch=switch, lapsed=True, reason=reason, abort=running)


def _running_on(switch: DeadmanSwitch) -> list[int]:
    """Runs still running that took something on the backend: it let go of them."""
    held = Resource.objects.filter(module=switch.module, backend=switch.backend).values("run_id")
    return list(Run.objects.filter(status=RunStatus.RUNNING, pk__in=held).order_by("id").values_list("id", flat=True))


def renew_module(module: str, backend: str | None = None) -> list[Renewal]:
    """Renew the sessions of one module's backends (of one, when ``backend`` names it), due
    or not: a reconcile's first contact, so that what a switch gave back is recorded as such
    before the reconcile could read it as gone."""
    if not ttl_s() or keepalive_of(module)[0] is None:
        return []
    switches = DeadmanSwitch.objects.filter(module=module, **({} if backend is None else {"backend": backend}))
    return [renew(switch) for switch in switches.order_by("id")]


def runs_let_go() -> list[tuple[int, str]]:
    """Runs still running whose backend's switch let go of them (a lapse is in their log),
    with its reason: the runner aborts them. Read from the log, so a lapse recorded where no
    runner was (a reconcile) or by a worker that died before it aborted still ends them."""
    lapsed = RunLog.objects.filter(run=OuterRef("pk"), kind=LogKind.BACKEND_LAPSED)
    running = Run.objects.filter(Exists(lapsed), status=RunStatus.RUNNING).order_by("id")
    answer = []
    for run_id in running.values_list("id", flat=True):
        entry = RunLog.objects.filter(run_id=run_id, kind=LogKind.BACKEND_LAPSED).order_by("-id").first()
        reason = entry.detail.get("reason", "") if entry is not None and isinstance(entry.detail, dict) else ""
        answer.append((run_id, str(reason)))
    return answer


def shown(module: str, backend: str = "") -> dict[str, Any] | None:
    """What people see of one backend's switch (the admin's module health, the API's
    backends): None when the backend keeps none."""
    switch = DeadmanSwitch.objects.filter(module=module, backend=backend).first()
    if switch is None:
        return None
    return {
        "armed": switch.armed and bool(ttl_s()),
        "ttl_s": switch.ttl_s,
        "session": str(switch.session),
        "renewed_at": switch.renewed_at,
        "last_error": switch.last_error,
        "holdings": holdings(module, backend),
        "lapses": switch.lapses,
        "last_lapse_at": switch.last_lapse_at,
        "last_lapse_reason": switch.last_lapse_reason,
    }


def shown_text(module: str, backend: str = "") -> str:
    """The switch as one line: armed or not, its ttl, its last renewal, what it holds, its lapses."""
    switch = shown(module, backend)
    if switch is None:
        return "-"
    renewed = timezone.localtime(switch["renewed_at"]).strftime("%H:%M:%S") if switch["renewed_at"] else "never"
    state = "armed" if switch["armed"] else "not armed"
    text = f"{state}, ttl {switch['ttl_s']} s, renewed {renewed}, holds {switch['holdings']}, lapses {switch['lapses']}"
    if switch["last_error"]:
        text += f"; last renewal failed: {switch['last_error'][:200]}"
    if switch["last_lapse_reason"]:
        text += f"; last lapse: {switch['last_lapse_reason']}"
    return text


def holdings(module: str, backend: str = "") -> int:
    """What the backend holds under the core's session, as the ledger says: its unresolved rows."""
    return Resource.objects.filter(module=module, backend=backend, state__in=UNRESOLVED).exclude(kind=STEP_KIND).count()
