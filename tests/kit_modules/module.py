"""The sandbox module, honest once and then broken one rule at a time (module ``kit``)."""

import uuid

from cleanup.registry import never_raises
from eventsite.sandbox.module import SpawnAction, SpawnerRateLease

MODULE = "kit"


class HonestSpawn(SpawnAction):
    id = "kit.spawn"
    module = MODULE


class LyingRevert(SpawnAction):
    """Answers that it gave everything back, and leaves it all in the world."""

    id = "kit.lying_revert"
    module = MODULE

    def revert(self, *, run_id, resources, idempotency_key):
        return {"ok": True, "failed": []}


class NewThingsOnRepeat(SpawnAction):
    """Spawns again for a key it has seen: a retried step doubles the orcs."""

    id = "kit.new_things_on_repeat"
    module = MODULE

    def perform(self, *, run_id, step_id, params, idempotency_key, session=None):
        return super().perform(
            run_id=run_id,
            step_id=step_id,
            params=params,
            idempotency_key=f"{idempotency_key}-{uuid.uuid4().hex[:8]}",
            session=session,
        )


class BlindReconcile(SpawnAction):
    """Answers "nothing is in force" when it could not ask the shard."""

    id = "kit.blind_reconcile"
    module = MODULE

    def reconcile(self, *, run_id, resources):
        answer = super().reconcile(run_id=run_id, resources=resources)
        return answer if answer.get("ok") else {"ok": True, "in_force": []}


class RaisingRevert(SpawnAction):
    """Raises when it is handed no rows, instead of giving back what the key made."""

    id = "kit.raising_revert"
    module = MODULE

    def revert(self, *, run_id, resources, idempotency_key):
        resources[0]  # IndexError for the empty list: the bug under test
        return super().revert(run_id=run_id, resources=resources, idempotency_key=idempotency_key)


class PermanentWhenDown(SpawnAction):
    """Answers every failure as terminal, a shard that is down for a minute included."""

    id = "kit.permanent_when_down"
    module = MODULE

    def perform(self, **kwargs):
        answer = super().perform(**kwargs)
        return answer if answer.get("ok") else {**answer, "retry": False}


class SwitchThatNeverFires(SpawnAction):
    """Keeps the session alive, and files nothing under it: when the core is gone, nothing
    is given back."""

    id = "kit.switch_never_fires"
    module = MODULE

    def perform(self, *, run_id, step_id, params, idempotency_key, backend="", session=None):
        return super().perform(
            run_id=run_id, step_id=step_id, params=params, idempotency_key=idempotency_key, backend=backend
        )


class HonestRate(SpawnerRateLease):
    id = "kit.rate"
    module = MODULE


class OverwritingRestore(SpawnerRateLease):
    """Puts the baseline back whatever is in place: someone else's value is lost."""

    id = "kit.overwriting_restore"
    module = MODULE

    @never_raises
    def restore(self, *, baseline, expected, run_id, target, backend=""):
        shard, path = self._where(target, backend)
        reply = shard.put(path, {"rate": baseline})
        return {"ok": True} if reply.ok else reply.failure()


class StrictRestore(SpawnerRateLease):
    """Reports drift when the baseline is already in place (an earlier restore landed)."""

    id = "kit.strict_restore"
    module = MODULE

    @never_raises
    def restore(self, *, baseline, expected, run_id, target, backend=""):
        shard, path = self._where(target, backend)
        reply = shard.put(path, {"rate": baseline, "expected": expected})
        if reply.status == 409:
            return {"ok": False, "drifted": True, "current": reply.body.get("current")}
        return {"ok": True} if reply.ok else reply.failure()


ACTIONS = [
    HonestSpawn(),
    LyingRevert(),
    NewThingsOnRepeat(),
    BlindReconcile(),
    RaisingRevert(),
    PermanentWhenDown(),
    SwitchThatNeverFires(),
]
LEASES = [HonestRate(), OverwritingRestore(), StrictRestore()]
