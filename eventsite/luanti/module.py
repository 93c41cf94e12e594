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
- ``keepalive(backend=..., session=..., ttl_s=...)`` renews the core's session with the mod,
  whose timer gives back what was spawned and set under it when no keepalive came for the
  ttl, with no core (the dead-man's switch, docs/modules.md); the mod keeps its sessions in
  the world's ``eventsite/state.lua``, so a restart forgets none of them.

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
    KeepaliveAnswer,
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
    return registry.retry(f"{world.label} answered {what} in a shape it should not")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _shard_of(resources: object) -> str:
    """The world the rows' payloads name (for a call made without its backend)."""
    for item in resources if isinstance(resources, list | tuple) else ():
        payload = item.get("payload") if isinstance(item, dict) else None
        if isinstance(payload, dict) and isinstance(shard := payload.get("shard"), str):
            return shard
    return ""


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


def _lapse(lapsed: object, world: World, backend: str) -> KeepaliveAnswer:
    """The mod's record of a lapsed session as ledger refs: its creatures and forceloads as
    they are, a setting as the lease ref of every target that names the world."""
    if not isinstance(lapsed, dict):
        return malformed(world, "a lapsed session")
    given = lapsed.get("creatures") or []
    settings = lapsed.get("settings") or {}
    kept = lapsed.get("kept") or {}
    if not _str_list(given) or not isinstance(settings, dict) or not isinstance(kept, dict):
        return malformed(world, "a lapsed session")
    given_back = [*given, *(ref for name in settings for ref in _lease_refs(str(name), backend))]
    kept_refs: dict[str, str] = {}
    for ref, why in kept.items():
        name = str(ref).removeprefix("setting:")
        for one in _lease_refs(name, backend) if str(ref).startswith("setting:") else [str(ref)]:
            kept_refs[one] = str(why)
    return registry.lapsed(given_back=given_back, kept=kept_refs, at=lapsed.get("at"), silent_s=lapsed.get("silent_s"))


def _filed(session: str | None) -> dict[str, Any]:
    """What a request carries to be filed under the core's session, when it has one."""
    return {"session": session} if session else {}


def _lease_refs(setting: str, backend: str) -> list[str]:
    """The ledger refs of a leased setting on a world: its target is the world's name, or
    ``default`` for the lone world."""
    targets = [backend, worlds.DEFAULT_TARGET] if backend else [worlds.DEFAULT_TARGET]
    leases = [lease for lease in (TIME_SPEED, SPAWN_RATE) if lease.setting == setting]
    return [registry.lease_ref(str(lease.id), target) for lease in leases for target in targets]


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
    def keepalive(self, *, backend: str = "", session: str, ttl_s: int) -> KeepaliveAnswer:
        """Renew the core's session with the mod; when its switch went off, what it gave back."""
        try:
            world = worlds.world(backend)
        except WorldError as exc:
            return terminal(str(exc))
        reply = mailbox.call(world, "keepalive", timeout=HEALTH_TIMEOUT_MS, session=session, ttl_s=ttl_s)
        if not reply.ok:
            return cast(KeepaliveAnswer, reply.failure())
        if reply.body.get("ok") is not True:
            return self._refused(world, reply.body, "keepalive")
        if reply.body.get("lapsed") is None:
            return {"ok": True}
        return _lapse(reply.body["lapsed"], world, backend)

    @never_raises
    def perform(
        self,
        *,
        run_id: int,
        step_id: int,
        params: dict[str, Any],
        idempotency_key: str,
        backend: str = "",
        session: str | None = None,
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
            **_filed(session),
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
            refs, world = registry.refs_of(resources), self._world(backend, _shard_of(resources))
        except (ValueError, WorldError) as exc:
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
                return registry.retry(f"{world.label} could not give back all the key made: {reasons}")
            return {"ok": True, "failed": []}
        refused: dict[str, str] = {}
        for chunk in registry.chunks(refs, CHUNK):
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
            refs, world = registry.refs_of(resources), self._world(backend, _shard_of(resources))
        except (ValueError, WorldError) as exc:
            return terminal(str(exc))
        present: set[str] = set()
        unknown: set[str] = set()
        for chunk in registry.chunks(refs, CHUNK):
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
    def apply(
        self, *, value: Any, run_id: int, target: str, backend: str = "", session: str | None = None
    ) -> ApplyAnswer:
        try:
            self.validate(value)
        except ValueError as exc:
            return terminal(str(exc))
        world, reply = self._ask(target, backend, value=value, **_filed(session))
        if world is None or not isinstance(reply, mailbox.Reply):
            return cast(ApplyAnswer, reply)
        if not reply.ok:
            return cast(ApplyAnswer, reply.failure())
        if reply.body.get("ok") is not True:
            return SpawnAction._refused(world, reply.body, "apply")
        return {"ok": True}

    @never_raises
    def restore(
        self,
        *,
        baseline: Any,
        expected: Any,
        run_id: int,
        target: str,
        backend: str = "",
        session: str | None = None,
    ) -> RestoreAnswer:
        if not _is_number(baseline) or not _is_number(expected):
            return terminal(f"baseline and expected must be numbers, not {baseline!r}, {expected!r}")
        # One request, one server step: the mod sets the baseline only while the value in
        # force is still `expected`, and answers success when the baseline is already there.
        # Under the session, a setting put back to its baseline is off the mod's switch.
        more = _filed(session)
        world, reply = self._ask(target, backend, value=baseline, expected=expected, baseline=baseline, **more)
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
