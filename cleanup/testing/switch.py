"""The conformance check of a module's dead-man's switch (rule 34), against its real backend.

For an action whose module declares ``keepalive``: arm a session with a short ttl, perform
under it, stop renewing, wait the ttl and a grace, then read the world back through the
module's own ``reconcile``: what the perform made must be gone, given back by the backend
alone, and the next ``keepalive`` for the session must answer that it lapsed, naming it.
May import: `calls` and the kit's own modules.
"""

import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from .. import calls
from ..deadman import takes_session
from .report import Caller, Report, describe

# The ttl the kit arms, and how long past it the backend may take to give back.
TTL_S = 3
GRACE_S = 2.0


class Performs(Protocol):
    """What the check needs of the action's checks (`cleanup.testing.actions.ActionChecks`)."""

    report: Report
    call: Caller
    params: dict[str, Any]
    keys: list[str]
    made: dict[str, dict[str, Any]]

    def has(self, name: str) -> bool: ...

    def in_force(self, resources: Any) -> Any: ...


def check_switch(
    checks: Performs, keepalive: Callable[..., object] | None, sleep: Callable[[float], None] = time.sleep
) -> None:
    """The backend gives back by itself, within the ttl and ``GRACE_S``, what was performed
    under a session nobody renews."""
    report = checks.report
    name = f"with no keepalive for {TTL_S} s, the backend gives back by itself what was performed under the session"
    if keepalive is None:
        report.skip(name, "the module has no keepalive()")
        return
    perform = getattr(checks.call.entry, "perform", None)
    if perform is None or not takes_session(perform) or not checks.has("reconcile"):
        report.check(name, False, "perform() taking `session`, and reconcile() to read the world back", "neither")
        return
    session = f"kit-{uuid.uuid4().hex}"
    armed = calls.classify_keepalive(
        checks.call.invoke(keepalive, "keepalive", session=session, ttl_s=TTL_S), "keepalive"
    )
    if not report.check(
        "keepalive arms a session", armed.ok and armed.value is None, "{ok: true}", armed.error or armed.value
    ):
        return
    renewed = time.monotonic()
    key = f"kit-{uuid.uuid4().hex}"
    checks.keys.append(key)
    answer = checks.call(
        "perform", run_id=0, step_id=0, params=dict(checks.params), idempotency_key=key, session=session
    )
    performed = calls.classify_perform(answer, "perform")
    for item in performed.resources:
        checks.made.setdefault(key, {}).setdefault(item["ref"], item)
    if not report.check(
        "perform answers under a session",
        performed.ok,
        "a perform under the session",
        performed.error or describe(answer),
    ):
        return
    made = list(performed.resources)
    sleep(max(0.0, renewed + TTL_S + GRACE_S - time.monotonic()))
    reply = checks.in_force(made)
    left = sorted(reply.value) if reply.ok else None
    report.check(
        name,
        reply.ok and not left,
        f"nothing in force {TTL_S + GRACE_S:g} s after the last keepalive",
        f"still in force: {left}" if reply.ok else reply.error,
    )
    told = calls.classify_keepalive(
        checks.call.invoke(keepalive, "keepalive", session=session, ttl_s=TTL_S), "keepalive"
    )
    given = told.value.get("given_back", []) if told.ok and isinstance(told.value, dict) else None
    refs = [item["ref"] for item in made]
    report.check(
        "the next keepalive answers that the session lapsed, naming what was given back",
        given is not None and set(refs) <= set(given),
        f"lapsed, given_back naming {refs[:5]}",
        told.error if not told.ok else repr(told.value)[:300],
    )
