"""Registration (issue 41, item 6): an action or a lease lacking an optional attribute works
exactly as if it were unset; one lacking a required attribute is refused when it registers,
by a message naming the attribute and the entry.

The entries here are plain classes, not subclasses of `registry.Action` or `registry.Lease`:
nothing is inherited, so every optional attribute is missing, not merely ``None``.
"""

from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.utils import timezone

from cleanup import outages, registry
from cleanup.models import Resource
from cleanup.runner import cancel_run, start_run, tick
from cleanup.sweep import sweep
from cleanup.testing.backends import health_of


def declared(cls, required):
    """The optional attributes of an entry: what the public class declares besides the
    required ones, and the dead-man's switch's ``keepalive`` (docs/modules.md)."""
    return tuple(sorted({n for n in vars(cls) if not n.startswith("_")} - set(required) | {"keepalive"}))


ACTION_OPTIONAL = declared(registry.Action, registry.ACTION_REQUIRED)
LEASE_OPTIONAL = declared(registry.Lease, registry.LEASE_REQUIRED)


def test_the_registry_fills_in_every_optional_attribute_the_public_classes_declare():
    assert set(registry.ACTION_OPTIONAL) == set(ACTION_OPTIONAL)
    assert set(registry.LEASE_OPTIONAL) == set(LEASE_OPTIONAL)


class PlainSpawn:
    """An action with ``id``, ``module``, ``perform`` and ``revert`` alone."""

    id = "plain.spawn"
    module = "plain"

    def __init__(self):
        self.world = {}  # ref -> the key that made it

    def perform(self, *, run_id, step_id, params, idempotency_key):
        refs = [f"orc-{idempotency_key[:6]}-{i}" for i in range(params.get("count", 1))]
        self.world.update(dict.fromkeys(refs, idempotency_key))
        return {"ok": True, "resources": [{"kind": "creature", "ref": ref} for ref in refs]}

    def revert(self, *, run_id, resources, idempotency_key):
        for resource in resources:
            self.world.pop(resource["ref"], None)
        return {"ok": True, "failed": []}


class PlainRate:
    """A lease with ``id``, ``module``, ``read``, ``apply`` and ``restore`` alone."""

    id = "plain.rate"
    module = "plain"

    def __init__(self):
        self.values = {"camp": 1}

    def read(self, *, target):
        return {"ok": True, "value": self.values.get(target)}

    def apply(self, *, value, run_id, target):
        self.values[target] = value
        return {"ok": True}

    def restore(self, *, baseline, expected, run_id, target):
        current = self.values.get(target)
        if current not in (baseline, expected):
            return {"ok": False, "drifted": True, "current": current}
        self.values[target] = baseline
        return {"ok": True}


def test_every_optional_attribute_of_a_plain_action_resolves_to_none_as_if_unset():
    action = registry.register_action(PlainSpawn())

    assert registry.get_action("plain.spawn") is action  # the module's own object, not a copy
    unset = {name: getattr(action, name) for name in ACTION_OPTIONAL if name != "revert"}
    assert unset == dict.fromkeys(unset)
    assert callable(action.revert)  # what the entry has is left as it is


def test_every_optional_attribute_of_a_plain_lease_resolves_to_none_as_if_unset():
    lease = registry.register_lease(PlainRate())

    assert registry.get_lease("plain.rate") is lease
    assert {name: getattr(lease, name) for name in LEASE_OPTIONAL} == dict.fromkeys(LEASE_OPTIONAL)


@pytest.mark.django_db
def test_a_plain_action_without_reconcile_is_reconciled_and_its_rows_swept_back():
    action = registry.register_action(PlainSpawn())
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        run = start_run(
            "plain",
            [{"action": "plain.spawn", "params": {"count": 2}}, {"action": "core.wait", "params": {"seconds": 600}}],
        )
        tick()  # performs through the plain action: no validate, backend_of or budget_ms
    creatures = Resource.objects.filter(run=run, kind="creature")
    assert creatures.count() == 2 and len(action.world) == 2

    out = StringIO()
    call_command("reconcile", "--module", "plain", stdout=out)
    call_command("reconcile", "--module", "plain", "--restarted", stdout=out)
    call_command("reconcile", stdout=out)
    # No reconcile is no answer: the ledger is left alone (rule 10).
    lines = out.getvalue().splitlines()
    assert lines[0] == "reconciled plain: asked 0, in force 0, orphaned 0, unanswered 2, resurrected 0"
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {"live"}

    with time_machine.travel(start + timedelta(seconds=1), tick=False):
        cancel_run(run.pk)
        sweep()

    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {"reverted"}
    assert action.world == {}


@pytest.mark.django_db
def test_a_plain_lease_goes_through_validate_health_reconcile_and_restore():
    lease = registry.register_lease(PlainRate())
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        # validate: a run with a core.lease step is checked at the door without one.
        run = start_run(
            "lease",
            [
                {"action": "core.lease", "params": {"lease": "plain.rate", "target": "camp", "value": 5}},
                {"action": "core.wait", "params": {"seconds": 600}},
            ],
        )
        tick()
    assert lease.values["camp"] == 5
    # health: the module has none, so nothing is asked and the kit skips it.
    assert (lease.validate, lease.health) == (None, None)
    assert outages.health_callable("plain") == (None, None)
    assert outages.ask_health("plain") is None
    assert health_of(lease) is None
    # The conformance kit's validate and health checks skip what the lease leaves out.
    kit = StringIO()
    call_command(
        "check_module",
        "plain.rate",
        "--target",
        "camp",
        "--value",
        "7",
        "--other-value",
        "9",
        "--no-outage",
        stdout=kit,
    )
    assert kit.getvalue().strip().splitlines()[-1].startswith("lease plain.rate on 'camp': all ")
    assert lease.values["camp"] == 5  # the kit gave back what it applied

    # After a restart the open lease is read: its applied value is in force, so it stays.
    out = StringIO()
    call_command("reconcile", "--module", "plain", "--restarted", stdout=out)
    assert out.getvalue().startswith("reconciled plain: ")
    assert Resource.objects.get(run=run, kind="override").state == "live"

    with time_machine.travel(start + timedelta(seconds=1), tick=False):
        cancel_run(run.pk)
        sweep()

    assert lease.values["camp"] == 1
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {"reverted"}


def _without(base, name):
    """An instance of a plain class like ``base`` without ``name`` (and without its ``__init__``)."""
    attrs = {k: v for k, v in vars(base).items() if k != name and not k.startswith("__")}
    return type(f"No{name.capitalize()}", (), attrs)()


@pytest.mark.parametrize("name", ["id", "module", "perform"])
def test_an_action_missing_a_required_attribute_is_refused_at_registration(name):
    entry = _without(PlainSpawn, name)

    with pytest.raises(registry.RegistryError) as refused:
        registry.register_action(entry)

    message = str(refused.value)
    assert f"missing the required attribute `{name}`" in message
    assert f"No{name.capitalize()}" in message  # names the entry's class, the id it has too
    if name != "id":
        assert "'plain.spawn'" in message
    assert registry.get_action("plain.spawn") is None


@pytest.mark.parametrize("name", ["id", "module", "read", "apply", "restore"])
def test_a_lease_missing_a_required_attribute_is_refused_at_registration(name):
    entry = _without(PlainRate, name)

    with pytest.raises(registry.RegistryError) as refused:
        registry.register_lease(entry)

    message = str(refused.value)
    assert message.startswith("lease ")
    assert f"missing the required attribute `{name}`" in message
    assert f"No{name.capitalize()}" in message
    if name != "id":
        assert "'plain.rate'" in message
    assert registry.get_lease("plain.rate") is None
