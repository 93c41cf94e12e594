"""``manage.py check_module``: the conformance kit (`cleanup.testing`) against a module's real backend.

May import: the engine's entry points and the models: the work is theirs, not the command's.
"""

import importlib
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from cleanup import calls, registry, testing
from cleanup.management.base import EventCommand


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{what} is not JSON: {exc}") from None


def _value(text: str) -> Any:
    """``--value 5`` is the number 5, ``--value '"5"'`` the string; text that is no JSON is a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _factory(path: str) -> Any:
    """The callable ``--refuse module.path:name`` names."""
    module_path, sep, name = path.partition(":")
    if not sep or not module_path or not name:
        raise CommandError(f"--refuse {path!r}: give MODULE:FACTORY, such as mygame.kit:refuse")
    try:
        found = getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"--refuse {path!r} cannot be loaded: {exc}") from None
    if not callable(found):
        raise CommandError(f"--refuse {path!r} is not callable")
    return found


class Command(EventCommand):
    help = "Check that an action or a lease keeps the module contract, against its real backend."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("id", help="an action id (with --params) or a lease id (with --target and --value)")
        parser.add_argument("--params", help="the action's params, a JSON object (default {})")
        parser.add_argument("--target", help="the lease's target")
        parser.add_argument("--value", help="the value to lease, JSON or plain text; not the value in force")
        parser.add_argument("--other-value", help="stands for someone else's value in the drift check")
        parser.add_argument(
            "--backend",
            metavar="NAME",
            help="the backend every call is for, as the engine names it (default: the one the params or target name)",
        )
        parser.add_argument(
            "--no-outage",
            action="store_true",
            help="skip the checks that refuse the network to see failures answered as retryable",
        )
        parser.add_argument(
            "--silent",
            action="store_true",
            help="simulate the outage as silence (requests dropped, answers never come) instead of a refusal",
        )
        parser.add_argument(
            "--refuse",
            metavar="MODULE:FACTORY",
            help="a context manager factory taking refs, during which the backend refuses to give those back",
        )

    def handle(
        self,
        *args: Any,
        id: str,
        params: str | None = None,
        target: str | None = None,
        value: str | None = None,
        other_value: str | None = None,
        no_outage: bool = False,
        silent: bool = False,
        refuse: str | None = None,
        backend: str | None = None,
        **options: Any,
    ) -> None:
        outage = None if no_outage else testing.network_silent if silent else testing.network_down
        refusal = _factory(refuse) if refuse else None
        if backend is not None and not calls.backend_name_ok(backend):
            raise CommandError(
                f"--backend {backend!r}: a backend's name is text of at most 100 characters, without '/'"
            )
        action, lease = registry.get_action(id), registry.get_lease(id)
        if action is not None:
            parsed = _json(params, "--params") if params is not None else {}
            if not isinstance(parsed, dict):
                raise CommandError("--params must be a JSON object")
            report = testing.run_action_checks(action, parsed, outage=outage, backend=backend, refuse=refusal)
        elif lease is not None:
            if target is None or value is None:
                raise CommandError(f"{id} is a lease: give --target and --value")
            if refusal is not None:
                raise CommandError("--refuse is for an action: a lease has nothing to refuse to give back")
            other = _value(other_value) if other_value is not None else None
            report = testing.run_lease_checks(lease, target, _value(value), other=other, outage=outage, backend=backend)
        else:
            known = ", ".join(sorted([*registry.actions(), *registry.leases()])) or "none"
            raise CommandError(f"no module registers an action or a lease {id!r} (registered: {known})")
        for line in report.lines():
            self.stdout.write(line)
        if not report.ok:
            raise CommandError(f"{report.subject}: {len(report.failures)} of {len(report.checks)} checks failed")
        self.stdout.write(f"{report.subject}: all {len(report.checks)} checks passed")
