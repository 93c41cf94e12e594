"""The conformance kit: does a module keep the contract of `cleanup.registry`?

Run it against the module's real backend, from a shell::

    python manage.py check_module sandbox.spawn --params '{"creature": "orc", "count": 2, "at": "gate"}'
    python manage.py check_module sandbox.spawner_rate --target orc-camp --value 5

or from the module's own test suite::

    from cleanup import testing

    def test_spawn_keeps_the_contract(shard):
        testing.check_action("sandbox.spawn", {"creature": "orc", "count": 2, "at": "gate"})

`check_action` and `check_lease` raise ``AssertionError`` listing every failed check;
`run_action_checks` and `run_lease_checks` answer the `Report` instead. Every call goes
through the engine's own call and classification code, and the checks give back what
they made. ``outage`` is a context manager factory during which the backend cannot be
reached: `network_down` by default (it refuses every socket of this process),
`network_silent` (nothing answers: requests dropped, reads time out), a test's own (the
sandbox shard's fault injection, a real server frozen), or None to skip those checks. An
entry that declares ``max_rate`` is sent a burst past it, which must be paced and blame
nothing. ``backend``
names the backend every callable is called for (``check_module --backend``; by default
the one the params or the target name), and the module's ``health()``, when it has one,
is checked on it. ``refuse`` (actions) is a context manager factory taking refs, during
which the backend refuses to give those back: the kit then checks that ``revert`` names
them in ``failed``, with a reason for each.
May import: `registry`, `calls` and its own modules: the kit calls a module, never the
engine's tables.
"""

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .. import registry
from ..registry import Action, Lease
from .actions import run_action_checks
from .leases import run_lease_checks
from .outage import Outage, Refusal, network_down, network_silent
from .report import Check, Report

__all__ = [
    "Check",
    "Outage",
    "Refusal",
    "Report",
    "check_action",
    "check_lease",
    "network_down",
    "network_silent",
    "run_action_checks",
    "run_lease_checks",
]


_Entry = TypeVar("_Entry", Action, Lease)


def _entry(entry: _Entry | str, lookup: Callable[[str], _Entry | None], kind: str) -> _Entry:
    if isinstance(entry, str):
        found = lookup(entry)
        if found is None:
            raise LookupError(f"no module registers the {kind} {entry!r}")
        return found
    return entry


def check_action(
    action: Action | str,
    params: Mapping[str, Any],
    outage: Outage | None = network_down,
    *,
    backend: str | None = None,
    refuse: Refusal | None = None,
) -> Report:
    """Run every check of an action (an id or the object); raise if any failed."""
    entry = _entry(action, registry.get_action, "action")
    return run_action_checks(entry, params, outage=outage, backend=backend, refuse=refuse).assert_ok()


def check_lease(
    lease: Lease | str,
    target: str,
    value: Any,
    other: Any = None,
    outage: Outage | None = network_down,
    *,
    backend: str | None = None,
) -> Report:
    """Run every check of a lease (an id or the object) on ``target``; raise if any failed."""
    entry = _entry(lease, registry.get_lease, "lease")
    return run_lease_checks(entry, target, value, other=other, outage=outage, backend=backend).assert_ok()
