"""The ``luanti`` module: creatures and settings on Luanti servers, given back when runs end.

- ``luanti.spawn`` (``{"entity": "wolf", "count": 3, "at": [x, y, z], "shard": "north"}``)
  spawns entities of the mod's own type (``eventsite:creature``), each carrying its run,
  ref and key in its staticdata, and forceloads their block (without players no block
  stays active). Each creature is a ``creature`` row and the forceload a ``forceload``
  row of its own, given back with them. ``revert`` removes by ref, or everything a key
  made (and revokes the key) when handed nothing; ``reconcile`` answers present, absent or
  unknown per ref: a creature in a block that is not active is looked for by waking the
  block, and one whose block could not be woken in time is unknown, never gone.
- ``luanti.time_speed`` and ``luanti.spawn_rate`` lease the server's ``time_speed`` and
  the mod's ``eventsite.spawn_rate``: ``read``, ``apply`` and a ``restore`` that is a
  compare-and-set done by the mod inside one server step, reporting drift.
- ``health(backend=...)`` answers the mod's boot id.

A step's backend is the world its ``shard`` param names (``LUANTI_WORLDS``); a lease's
target is the world's name (``default`` for a lone world without one).
May import: `cleanup.registry`, `cleanup.envelopes` and the module's own parts.
"""

import logging
import math
import re
from typing import Any, cast

from cleanup import registry
from cleanup.envelopes import (
    ApplyAnswer,
    Failure,
    HealthAnswer,
    PerformAnswer,
    ReadAnswer,
    ReconcileAnswer,
    RecordedResource,
    ResourceEntry,
    RestoreAnswer,
    RevertAnswer,
)
from cleanup.registry import never_raises, terminal

from . import mailbox, worlds
from .worlds import World, WorldError

logger = logging.getLogger(__name__)

MODULE = mailbox.MODULE
MAX_COUNT = 50  # the mod's own bound; a block holds at most max_objects_per_block (256)
MAX_COORD = 30_000
CHUNK = 200  # refs per request
ENTITY = re.compile(r"[A-Za-z0-9_-]{1,64}")
SPAWN_PARAMS = ("entity", "count", "at", "shard")
HEALTH_TIMEOUT_MS = 3_000


def malformed(world: World, what: str) -> Failure:
    return {"ok": False, "error": f"{world.label} answered {what} in a shape it should not", "retry": True}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _refs_of(resources: object) -> list[str]:
    """The refs of the resources the engine handed over, each once, in order."""
    if not isinstance(resources, list | tuple):
        raise ValueError(f"resources must be a list, not {type(resources).__name__}")
    refs = []
    for item in resources:
        ref = item.get("ref") if isinstance(item, dict) else None
        if not isinstance(ref, str) or not ref.strip():
            raise ValueError(f"a resource without a ref: {item!r}")
        refs.append(ref)
    return list(dict.fromkeys(refs))


def _shard_of(resources: object) -> str:
    """The world the rows' payloads name (for a call made without its backend)."""
    for item in resources if isinstance(resources, list | tuple) else ():
        payload = item.get("payload") if isinstance(item, dict) else None
        if isinstance(payload, dict) and isinstance(payload.get("shard"), str):
            return payload["shard"]
    return ""


def _chunks(refs: list[str]) -> list[list[str]]:
    return [refs[i : i + CHUNK] for i in range(0, len(refs), CHUNK)]


def _health(backend: str) -> HealthAnswer:
    try:
        world = worlds.world(backend)
    except WorldError as exc:
        return terminal(str(exc))
    reply = mailbox.call(world, "health", timeout=HEALTH_TIMEOUT_MS)
    if not reply.ok:
        return cast(HealthAnswer, reply.failure())
    boot_id = reply.body.get("boot_id")
    if reply.body.get("ok") is not True or not isinstance(boot_id, str):
        return malformed(world, "health")
    return {"ok": True, "boot_id": boot_id}


class SpawnAction(registry.Action):
    """``luanti.spawn``: ``{"entity": "wolf", "count": 3, "at": [0, 8, 0], "shard": "north"}``."""

    id = "luanti.spawn"
    module = MODULE
    # Each request waits at most LUANTI_TIMEOUT_MS (10 s) and 1.5 s more: well inside.
    budget_ms = 15_000

    def validate(self, params: dict[str, Any]) -> None:
        if not isinstance(params, dict):
            raise ValueError("params must be an object with entity, count and at")
        unknown = sorted(set(params) - set(SPAWN_PARAMS))
        if unknown:
            raise ValueError(f"{unknown[0]} is not a parameter of {self.id}")
        entity = params.get("entity")
        if not isinstance(entity, str) or not ENTITY.fullmatch(entity):
            raise ValueError("entity must be a name of letters, digits, _ and - (at most 64)")
        count = params.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise ValueError(f"count must be a whole number from 1 to {MAX_COUNT}")
        at = params.get("at")
        if not isinstance(at, list) or len(at) != 3 or not all(_is_number(n) and abs(n) <= MAX_COORD for n in at):
            raise ValueError(f"at must be [x, y, z], three numbers within {MAX_COORD}")
        if "shard" in params:
            shard = params["shard"]
            if not isinstance(shard, str) or not worlds.NAME.fullmatch(shard):
                raise ValueError("shard must name a world of LUANTI_WORLDS")

    def backend_of(self, params: dict[str, Any]) -> str:
        return worlds.backend_named(params.get("shard") if isinstance(params, dict) else None)

    def _world(self, backend: str, fallback: str) -> World:
        return worlds.world(backend or fallback)

    @never_raises
    def health(self, *, backend: str = "") -> HealthAnswer:
        """The mod answers, with its boot id (made when the mod loaded)."""
        return _health(backend)

    @never_raises
    def perform(
        self, *, run_id: int, step_id: int, params: dict[str, Any], idempotency_key: str, backend: str = ""
    ) -> PerformAnswer:
        try:
            self.validate(params)
        except ValueError as exc:
            return terminal(str(exc))
        if not isinstance(idempotency_key, str) or not idempotency_key.strip():
            return terminal("the step has no idempotency key")
        try:
            world = self._world(backend, self.backend_of(params))
        except WorldError as exc:
            return terminal(str(exc))
        reply = mailbox.call(
            world,
            "spawn",
            key=f"spawn/{idempotency_key}",
            spawn_key=idempotency_key,
            entity=params["entity"],
            count=params["count"],
            at=params["at"],
            run=run_id,
        )
        if not reply.ok:
            return cast(PerformAnswer, reply.failure())
        body = reply.body
        if body.get("ok") is not True:
            return self._refused(world, body, "spawn")
        creatures, forceload = body.get("creatures"), body.get("forceload")
        if not _str_list(creatures) or not creatures or not isinstance(forceload, str):
            return malformed(world, "a spawn")
        payload = {
            "entity": params["entity"],
            "at": params["at"],
            "shard": world.name,
            "idempotency_key": idempotency_key,
        }
        resources: list[ResourceEntry] = [{"kind": "creature", "ref": ref, "payload": payload} for ref in creatures]
        # Last, so that a revert of part of the rows takes the creatures first.
        resources.append({"kind": "forceload", "ref": forceload, "payload": payload})
        return {"ok": True, "resources": resources}

    @staticmethod
    def _refused(world: World, body: dict[str, Any], what: str) -> Failure:
        error = body.get("error")
        message = error if isinstance(error, str) and error.strip() else f"the mod refused the {what}"
        return {"ok": False, "error": f"{world.label}: {message}", "retry": body.get("retry") is not False}

    @never_raises
    def revert(
        self, *, run_id: int, resources: list[RecordedResource], idempotency_key: str, backend: str = ""
    ) -> RevertAnswer:
        try:
            refs = _refs_of(resources)
        except ValueError as exc:
            return terminal(str(exc))
        try:
            world = self._world(backend, _shard_of(resources))
        except WorldError as exc:
            return terminal(str(exc))
        if not refs:
            # The step recorded nothing: whatever its key made is its to give back, and
            # the mod revokes the key first, so nothing lands under it afterwards.
            if not isinstance(idempotency_key, str) or not idempotency_key.strip():
                return {"ok": True, "failed": []}
            reply = mailbox.call(world, "despawn", spawn_key=idempotency_key, refs=[])
            if not reply.ok:
                return cast(RevertAnswer, reply.failure())
            if reply.body.get("ok") is not True:
                return self._refused(world, reply.body, "despawn")
            failed = self._failed(reply.body)
            if failed is None:
                return malformed(world, "a despawn")
            if failed:
                reasons = "; ".join(f"{ref}: {why}" for ref, why in failed.items())
                error = f"{world.label} could not give back all the key made: {reasons}"
                return {"ok": False, "error": error, "retry": True}
            return {"ok": True, "failed": []}
        refused: dict[str, str] = {}
        for chunk in _chunks(refs):
            reply = mailbox.call(world, "despawn", spawn_key=idempotency_key, refs=chunk)
            if not reply.ok:
                return cast(RevertAnswer, reply.failure())  # what was removed stays so: a retry is safe
            if reply.body.get("ok") is not True:
                return self._refused(world, reply.body, "despawn")
            failed = self._failed(reply.body)
            if failed is None or not _str_list(reply.body.get("removed")) or not _str_list(reply.body.get("absent")):
                return malformed(world, "a despawn")
            refused.update({ref: why for ref, why in failed.items() if ref in chunk})
        # Removed or already absent: either way no longer in the world.
        return {"ok": True, "failed": refused}

    @staticmethod
    def _failed(body: dict[str, Any]) -> dict[str, str] | None:
        failed = body.get("failed")
        if failed is None or failed == []:
            return {}
        if not isinstance(failed, dict):
            return None
        return {str(ref): str(why) for ref, why in failed.items()}

    @never_raises
    def reconcile(self, *, run_id: int, resources: list[RecordedResource], backend: str = "") -> ReconcileAnswer:
        try:
            refs = _refs_of(resources)
        except ValueError as exc:
            return terminal(str(exc))
        try:
            world = self._world(backend, _shard_of(resources))
        except WorldError as exc:
            return terminal(str(exc))
        present: set[str] = set()
        unknown: set[str] = set()
        for chunk in _chunks(refs):
            reply = mailbox.call(world, "lookup", refs=chunk)
            if not reply.ok:
                return cast(ReconcileAnswer, reply.failure())  # not knowing is never "all gone"
            body = reply.body
            if body.get("ok") is not True:
                return self._refused(world, body, "lookup")
            if not all(_str_list(body.get(name)) for name in ("present", "absent", "unknown")):
                return malformed(world, "a lookup")
            present.update(body["present"])
            unknown.update(body["unknown"])
            told = set(body["present"]) | set(body["absent"]) | set(body["unknown"])
            unknown.update(set(chunk) - told)  # a ref the mod did not mention is not known
        in_force = [r for r in refs if r in present]
        not_known = [r for r in refs if r in unknown and r not in present]
        if not_known:
            return {"ok": True, "in_force": in_force, "unknown": not_known}
        return {"ok": True, "in_force": in_force}


class SettingLease(registry.Lease):
    """A lease over one number setting of the server, on the world its target names."""

    module = MODULE
    budget_ms = 15_000
    setting = ""
    low, high = 0.0, 1.0

    def validate(self, value: Any) -> None:
        if not _is_number(value) or not self.low <= value <= self.high:
            raise ValueError(f"{self.setting} is a number from {self.low:g} to {self.high:g}, got {value!r}")

    def backend_of(self, target: str) -> str:
        return worlds.backend_of_target(target)

    @never_raises
    def health(self, *, backend: str = "") -> HealthAnswer:
        return _health(backend)

    def _world(self, target: object, backend: str) -> World:
        if not isinstance(target, str) or not target.strip():
            raise WorldError("target must name a world of LUANTI_WORLDS (default: the only one)")
        return worlds.world(backend or worlds.backend_of_target(target))

    def _ask(self, target: object, backend: str, **args: Any) -> tuple[World | None, mailbox.Reply | Failure]:
        try:
            world = self._world(target, backend)
        except WorldError as exc:
            return None, terminal(str(exc))
        return world, mailbox.call(world, "setting", setting=self.setting, **args)

    @never_raises
    def read(self, *, target: str, backend: str = "") -> ReadAnswer:
        world, reply = self._ask(target, backend)
        if world is None or not isinstance(reply, mailbox.Reply):
            return cast(ReadAnswer, reply)
        if not reply.ok:
            return cast(ReadAnswer, reply.failure())
        if reply.body.get("ok") is not True:
            return SpawnAction._refused(world, reply.body, "read")
        if not _is_number(reply.body.get("value")):
            return malformed(world, f"a read of {self.setting}")
        return {"ok": True, "value": reply.body["value"]}

    @never_raises
    def apply(self, *, value: Any, run_id: int, target: str, backend: str = "") -> ApplyAnswer:
        try:
            self.validate(value)
        except ValueError as exc:
            return terminal(str(exc))
        world, reply = self._ask(target, backend, value=value)
        if world is None or not isinstance(reply, mailbox.Reply):
            return cast(ApplyAnswer, reply)
        if not reply.ok:
            return cast(ApplyAnswer, reply.failure())
        if reply.body.get("ok") is not True:
            return SpawnAction._refused(world, reply.body, "apply")
        return {"ok": True}

    @never_raises
    def restore(self, *, baseline: Any, expected: Any, run_id: int, target: str, backend: str = "") -> RestoreAnswer:
        if not _is_number(baseline) or not _is_number(expected):
            return terminal(f"baseline and expected must be numbers, not {baseline!r}, {expected!r}")
        # One request, one server step: the mod sets the baseline only while the value in
        # force is still `expected`, and answers success when the baseline is already there.
        world, reply = self._ask(target, backend, value=baseline, expected=expected, baseline=baseline)
        if world is None or not isinstance(reply, mailbox.Reply):
            return cast(RestoreAnswer, reply)
        if not reply.ok:
            return cast(RestoreAnswer, reply.failure())
        body = reply.body
        if body.get("ok") is True:
            return {"ok": True}
        if body.get("drifted") is True and _is_number(body.get("current")):
            if body["current"] == baseline:
                return {"ok": True}
            return {"ok": False, "drifted": True, "current": body["current"]}
        return SpawnAction._refused(world, body, "restore")


class TimeSpeedLease(SettingLease):
    """``luanti.time_speed``: how fast the day goes by (72: a day in 20 minutes)."""

    id = "luanti.time_speed"
    setting = "time_speed"
    low, high = 0.0, 100_000.0


class SpawnRateLease(SettingLease):
    """``luanti.spawn_rate``: the mod's ``eventsite.spawn_rate``, creatures per minute."""

    id = "luanti.spawn_rate"
    setting = "eventsite.spawn_rate"
    low, high = 0.0, 1_000.0


SPAWN = SpawnAction()
TIME_SPEED = TimeSpeedLease()
SPAWN_RATE = SpawnRateLease()
