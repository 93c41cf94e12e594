"""The conformance checks of a module's backends: which backend a step or a target names,
and the module's ``health()`` (ok with a boot id while the backend is up, ``unavailable``
while it is down).

May import: `calls`, `registry` and the kit's own modules.
"""

import time
from typing import Any

from .. import calls, registry
from ..registry import Action, Health, Lease
from .outage import Outage
from .report import Caller, Report, describe


def resolve_backend(entry: Action | Lease, value: Any) -> tuple[str | None, str | None]:
    """What ``entry.backend_of(value)`` names, as the engine reads it: ``(backend, None)``
    or ``(None, why not)``."""
    return calls.backend_of(entry, value, str(entry.id))


def check_backend_of(
    report: Report, entry: Action | Lease, named: str | None, problem: str | None, given: str | None, of: str
) -> None:
    """``backend_of`` names a backend for the kit's params or target, the one given if any."""
    name = f"backend_of names the backend of the {of}"
    if given is None:
        report.check(name, problem is None, "a backend's name (text without '/')", problem)
        return
    report.check(name, problem is None and named == given, f"{given!r}, the backend given", problem or f"{named!r}")


def health_of(entry: Action | Lease) -> Health | None:
    """The module's ``health``: the entry's own, else that of another registered entry of
    its module (the engine asks any one of them)."""
    own: Health | None = getattr(entry, "health", None)
    if callable(own):
        return own
    others: list[Action | Lease] = [*registry.actions().values(), *registry.leases().values()]
    for other in others:
        if other.module == entry.module and callable(getattr(other, "health", None)):
            return other.health
    return None


def check_health(report: Report, call: Caller, entry: Action | Lease, outage: Outage | None) -> None:
    """``health()`` answers ok with a stable boot id while the backend is up, and a failure
    with ``unavailable: true`` while it is down (when the kit can take it down)."""
    first = "health answers ok while the backend is up"
    fn = health_of(entry)
    if fn is None:
        report.skip(
            first,
            "the module has no health(): a down backend is probed by letting an ordinary call through, "
            "and a restart nobody reports goes unseen",
        )
        return
    what = f"{entry.module}.health"
    answer = call.invoke(fn, what)
    reply = calls.classify_health(answer, what)
    if report.check(first, reply.ok, '{"ok": True, "boot_id": "..."}', reply.error or describe(answer)):
        check_boot_id(report, call, fn, what, answer, reply)
    if outage is None:
        return
    with outage():
        down = call.invoke(fn, what)
    raw = down.raw
    report.check(
        "with the backend down, health answers a failure with unavailable: true",
        not down.exception and isinstance(raw, dict) and raw.get("ok") is False and raw.get("unavailable") is True,
        '{"ok": False, "error": "...", "unavailable": True}',
        describe(down),
    )


def check_boot_id(
    report: Report, call: Caller, fn: Health, what: str, answer: calls.Answer, reply: calls.Reply
) -> None:
    name = "health answers the backend's boot id, the same while it runs"
    raw = answer.raw
    if not isinstance(raw, dict) or raw.get("boot_id") is None:
        report.skip(name, "health gives no boot_id: a restart nobody reports goes unseen until a call notices")
        return
    again = calls.classify_health(call.invoke(fn, what), what)
    report.check(
        name,
        reply.value is not None and again.ok and again.value == reply.value,
        f"a boot id (printable text of at most {calls.MAX_BOOT_ID} characters), the same twice",
        f"{raw.get('boot_id')!r}, then {again.value!r}" if again.ok else again.error,
    )


PACED = "a burst past max_rate is paced and not marked down"


def check_paced_burst(report: Report, call: Caller, entry: Action | Lease) -> None:
    """With ``max_rate`` declared, a burst of ``max_burst + 3`` health calls all answer, none
    blaming the backend (each waits its turn instead), and the burst takes its time."""
    rate = getattr(entry, "max_rate", None)
    if rate is None:
        report.skip(
            PACED,
            "no max_rate: a backend that drops requests past a rate sees its drops counted as an outage",
        )
        return
    fn = health_of(entry)
    if fn is None:
        report.skip(PACED, "the module has no health() for the kit to call in a burst")
        return
    burst = getattr(entry, "max_burst", None) or 1
    count = burst + 3
    what = f"{entry.module}.health"
    began = time.monotonic()
    answers = [call.invoke(fn, what) for _ in range(count)]
    took = time.monotonic() - began
    blamed = [describe(a) for a in answers if a.timed_out or (isinstance(a.raw, dict) and a.raw.get("unavailable"))]
    failed = [describe(a) for a in answers if not (isinstance(a.raw, dict) and a.raw.get("ok") is True)]
    least = 2 / float(rate) * 0.8  # at least the last two calls waited their turns
    report.check(
        PACED,
        not blamed and not failed and took >= least,
        f"{count} health calls answered ok, none unavailable, over at least {least:.1f} s",
        f"{len(blamed)} blamed the backend, {len(failed)} failed, in {took:.1f} s: {(blamed or failed)[:2]}",
    )
