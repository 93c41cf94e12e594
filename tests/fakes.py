"""Modules and ledger rows for tests: real registry entries whose answers a test scripts."""

import itertools
import threading
import uuid

from cleanup import registry
from cleanup.models import LEASE_KIND, STEP_KIND, Resource, Run, RunStatus, Step

_keys = itertools.count(1)


class Scripted:
    """Answers from a script: one entry per call (the last repeats), or a callable.

    An entry that is an exception instance is raised; every call is recorded.
    """

    def __init__(self, *answers):
        self.answers = list(answers) or [{"ok": True}]
        self.calls = []
        self._lock = threading.Lock()

    def __call__(self, **kwargs):
        with self._lock:
            self.calls.append(kwargs)
            index = min(len(self.calls) - 1, len(self.answers) - 1)
            answer = self.answers[index]
        if callable(answer) and not isinstance(answer, type):
            return answer(**kwargs)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class FakeAction(registry.Action):
    def __init__(
        self, id="test.spawn", module="test", revert=None, reconcile=None, perform=None, validate=None, budget_ms=None
    ):
        self.id = id
        self.module = module
        self.budget_ms = budget_ms
        self.revert = revert
        self.reconcile = reconcile
        self._perform = perform or Scripted({"ok": True, "resources": []})
        if validate is not None:
            self.validate = validate

    def perform(self, **kwargs):
        return self._perform(**kwargs)


class FakeLease(registry.Lease):
    """A lease over an in-memory table of values, restoring only when `expected` holds."""

    def __init__(self, id="test.rate", module="test", values=None, restore=None, budget_ms=None):
        self.id = id
        self.module = module
        self.budget_ms = budget_ms
        self.values = values if values is not None else {}
        self.restores = []
        self._restore = restore

    def read(self, *, target):
        return {"ok": True, "value": self.values.get(target)}

    def apply(self, *, value, run_id, target):
        self.values[target] = value
        return {"ok": True}

    def restore(self, *, baseline, expected, run_id, target):
        self.restores.append({"baseline": baseline, "expected": expected, "run_id": run_id, "target": target})
        if self._restore is not None:
            return self._restore(baseline=baseline, expected=expected, run_id=run_id, target=target)
        current = self.values.get(target)
        if current == baseline:
            return {"ok": True}
        if current != expected:
            return {"ok": False, "drifted": True, "current": current}
        self.values[target] = baseline
        return {"ok": True}


def make_run(status=RunStatus.COMPLETED, name="test run", **fields):
    return Run.objects.create(name=name, status=status, **fields)


def make_step(run, action_id="test.spawn", position=None, **fields):
    if position is None:
        position = run.steps.count()
    return Step.objects.create(
        run=run,
        position=position,
        action_id=action_id,
        idempotency_key=fields.pop("idempotency_key", f"key-{uuid.uuid4().hex[:12]}-{next(_keys)}"),
        status=fields.pop("status", "done"),
        **fields,
    )


def make_rows(step, refs, module="test", kind="creature", placeholder=True):
    """A step's ledger: its placeholder (when asked) and one row per ref."""
    rows = []
    if placeholder:
        rows.append(
            Resource.objects.create(
                run_id=step.run_id,
                step=step,
                module=module,
                kind=STEP_KIND,
                ref=step.idempotency_key,
                action=step.action_id,
            )
        )
    for ref in refs:
        rows.append(
            Resource.objects.create(
                run_id=step.run_id,
                step=step,
                module=module,
                kind=kind,
                ref=ref,
                action=step.action_id,
            )
        )
    return rows


def make_lease_row(run, lease_id="test.rate", target="camp", baseline=1, applied=5, module="test", step=None):
    return Resource.objects.create(
        run=run,
        step=step,
        module=module,
        kind=LEASE_KIND,
        ref=registry.lease_ref(lease_id, target),
        action="core.lease",
        payload={"baseline": baseline, "applied": applied},
    )


def states(run):
    return dict(Resource.objects.filter(run=run).values_list("ref", "state"))


def log_kinds(run):
    return list(run.log.values_list("kind", flat=True))


def spawner(world=None):
    """A perform that makes `count` creatures per call, named after the step's key."""
    world = world if world is not None else {}

    def perform(*, run_id, step_id, params, idempotency_key):
        refs = [f"{params.get('creature', 'orc')}-{idempotency_key[:6]}-{i}" for i in range(params.get("count", 1))]
        world.update({ref: idempotency_key for ref in refs})
        return {"ok": True, "resources": [{"kind": "creature", "ref": ref} for ref in refs]}

    return perform


def despawner(world):
    def revert(*, run_id, resources, idempotency_key):
        for r in resources:
            world.pop(r["ref"], None)
        for ref in [ref for ref, key in world.items() if key == idempotency_key]:
            world.pop(ref)
        return {"ok": True, "failed": []}

    return revert
