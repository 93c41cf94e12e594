"""The ``sandbox`` module: spawn creatures on the sandbox shard, lease a spawner's rate.

This is the worked example of a module (see ``docs/modules.md``), and of a module that
serves a fleet of backends: each shard of ``SANDBOX_SHARDS`` is one backend, named by a
step's ``"shard"`` param (``sandbox.spawn``) or by its target (``north:orc-camp`` for the
lease), and every callable takes the ``backend`` keyword and talks to that shard alone. A
site with one shard (``SANDBOX_SHARD_URL``) has one backend, ``""``, and names none. What
it shows:

- every callable answers an envelope and never raises (`cleanup.registry.never_raises`),
  and a request that will never succeed is answered `terminal` (`cleanup.registry.terminal`);
- ``perform`` sends the step's idempotency key with the spawn, so a retried step, or a
  call that timed out here but landed on the shard, spawns once;
- ``revert`` gives back what it is handed, counts "already gone" as given back, names
  the creatures the shard refused to despawn as ``failed`` (the row's own failure), and when
  it is handed nothing (the step's worker died before recording) finds what the key
  spawned and gives that back;
- ``reconcile`` says which refs the shard still has, and fails when it cannot tell;
- the lease restores only over the value it applied (``expected``) and reports drift;
- ``health(backend=…)`` answers the shard's boot id, so the engine sees a restart nobody
  reported, and ``unavailable: true`` when the shard cannot be reached;
- ``keepalive(backend=…, session=…, ttl_s=…)`` renews the core's session on the shard, whose
  dead-man's switch gives back what was filed under it (``perform``, ``apply`` and
  ``restore`` send the session) when the core falls silent, and tells which ledger refs
  it gave back when the session had lapsed;
- the client (`eventsite.sandbox.client`) maps transport errors and 5xx to ``retry:
  True``, 4xx to ``retry: False``, and reports a shard restart to the engine, naming it.
May import: `cleanup.registry` and `cleanup.envelopes`, and its own client.
"""

import logging
import math
from typing import Any, TypeGuard
from urllib.parse import quote

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
    RestoreAnswer,
    RevertAnswer,
)
from cleanup.registry import never_raises, terminal

from .client import Fleet, ShardClient, resolve

logger = logging.getLogger(__name__)

MODULE = "sandbox"
MAX_COUNT = 500
MAX_TEXT = 200
MAX_RATE = 1_000_000  # what the shard accepts (eventsite.sandbox.shard)
CHUNK = 500  # refs per despawn or lookup request (the shard takes up to 1000)
SPAWN_PARAMS = ("creature", "count", "at", "shard")
# A lease's target names its shard before a colon (north:orc-camp); a spawner's name has none.
TARGET_SHARD = ":"

fleet = Fleet(MODULE)


def malformed(what: str) -> Failure:
    return registry.retry(f"the shard answered {what} in a shape it should not")


def _text(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{name} must be at most {MAX_TEXT} characters")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _str_list(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _known_shard(name: str, field: str) -> str:
    """``name`` when the fleet has a shard by that name; else ValueError naming ``field``."""
    names = fleet.names()
    if name in names:
        return name
    if names == [""]:
        raise ValueError(f"{field}: this site has one shard (SANDBOX_SHARD_URL), which has no name; leave out {name!r}")
    raise ValueError(f"{field}: no shard is named {name!r}; the shards are {', '.join(names)}")


def _only_shard(field: str, how: str) -> str:
    """The fleet's only shard's name; ValueError naming ``field`` when there are several."""
    names = fleet.names()
    if len(names) == 1:
        return names[0]
    raise ValueError(f"{field} must name a shard ({how}): this site has several: {', '.join(names)}")


def shard_of_params(params: dict[str, Any]) -> str:
    """The shard a spawn with these params acts on: its ``"shard"``, or the only one."""
    shard = params.get("shard")
    if shard is None:
        return _only_shard("shard", 'add "shard" to the params')
    if not isinstance(shard, str) or not shard.strip():
        raise ValueError("shard must be a non-empty string naming a shard")
    return _known_shard(shard, "shard")


def split_target(target: object) -> tuple[str | None, str]:
    """``(shard or None, spawner)`` of a lease target: ``north:orc-camp`` or ``orc-camp``."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError("target must name a spawner")
    shard, colon, spawner = target.partition(TARGET_SHARD)
    if not colon:
        return None, target
    if not shard or not spawner:
        raise ValueError(f"target {target!r} must be SHARD:SPAWNER or SPAWNER")
    return shard, spawner


def shard_of_target(target: object) -> str:
    """The shard a lease target is on: the one it names, or the only one."""
    shard, _spawner = split_target(target)
    if shard is None:
        return _only_shard("target", "as SHARD:SPAWNER, such as north:orc-camp")
    return _known_shard(shard, "target")


def client_for(backend: str, named: str | None = None) -> ShardClient:
    """The client a call goes to: its ``backend`` (what the engine recorded for the step or
    row), else the shard the call's params or target name (``named``), else the only one.
    A call whose backend and params name two shards is refused (ValueError)."""
    if named is not None and backend and resolve(backend) != named:
        raise ValueError(f"the call names the shard {named!r} but is for the shard {backend!r}")
    return fleet.client(backend or (named or ""))


class SpawnAction(registry.Action):
    """``sandbox.spawn``: ``{"creature": "orc", "count": 20, "at": "north-gate", "shard": "north"}``;
    ``shard`` names the shard it spawns on (``SANDBOX_SHARDS``), and may be left out where
    the site has one shard only."""

    id = "sandbox.spawn"
    module = MODULE
    # Each request has its own timeout (SANDBOX_SHARD_TIMEOUT_MS, 3 s); a revert makes
    # at most a lookup and a despawn per chunk, well inside the budget.
    budget_ms = 10_000

    def validate(self, params: dict[str, Any]) -> None:
        self._check_params(params)
        shard_of_params(params)

    def _check_params(self, params: dict[str, Any]) -> None:
        """Everything `validate` checks but which shards the site has."""
        if not isinstance(params, dict):
            raise ValueError("params must be an object with creature, count and at")
        unknown = sorted(set(params) - set(SPAWN_PARAMS))
        if unknown:
            raise ValueError(f"{unknown[0]} is not a parameter of {self.id}")
        _text(params, "creature")
        count = params.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise ValueError(f"count must be a whole number from 1 to {MAX_COUNT}")
        _text(params, "at")
        shard = params.get("shard")
        if shard is not None and (not isinstance(shard, str) or not shard.strip()):
            raise ValueError("shard must be a non-empty string naming a shard")

    def backend_of(self, params: dict[str, Any]) -> str:
        """The shard a step acts on, its backend: the ``"shard"`` it names, or the only one."""
        return shard_of_params(params)

    @never_raises
    def health(self, *, backend: str = "") -> HealthAnswer:
        """Does the shard answer, and which boot is it in? The engine probes a shard that is
        down, and watches one that is up: a boot id it has not seen is a restart."""
        reply = fleet.client(backend).get("/health")
        if not reply.ok:
            return reply.failure()  # `unavailable: true` when the shard cannot be reached
        boot_id = reply.body.get("boot_id")
        if not isinstance(boot_id, str) or not boot_id:
            return malformed("its health")
        return {"ok": True, "boot_id": boot_id}

    @never_raises
    def keepalive(self, *, backend: str = "", session: str, ttl_s: int) -> KeepaliveAnswer:
        """Renew the core's session on the shard; when its switch went off, say what it gave back."""
        reply = fleet.client(backend).post("/keepalive", {"session": session, "ttl_s": ttl_s})
        if not reply.ok:
            return reply.failure()
        lapsed = reply.body.get("lapsed")
        if lapsed is None:
            return {"ok": True}
        return _lapse(lapsed, backend) or malformed("a lapsed session")

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
            self._check_params(params)
            # The backend the engine recorded for the step, else the one the params name.
            shard = client_for(backend, params.get("shard")) if backend else fleet.client(shard_of_params(params))
        except ValueError as exc:
            return terminal(str(exc))
        if not isinstance(idempotency_key, str) or not idempotency_key.strip():
            return terminal("the step has no idempotency key")
        reply = shard.post(
            "/spawn",
            {
                "key": idempotency_key,
                "creature": params["creature"],
                "count": params["count"],
                "at": params["at"],
                **({"session": session} if session else {}),
            },
        )
        if not reply.ok:
            return reply.failure()
        creatures = reply.body.get("creatures")
        if not isinstance(creatures, list) or not all(
            isinstance(c, dict) and isinstance(c.get("ref"), str) and c["ref"] for c in creatures
        ):
            return malformed("a spawn")
        return {
            "ok": True,
            "resources": [
                {
                    "kind": "creature",
                    "ref": c["ref"],
                    "payload": {
                        "creature": params["creature"],
                        "at": params["at"],
                        "idempotency_key": idempotency_key,
                    },
                }
                for c in creatures
            ],
        }

    @never_raises
    def revert(
        self, *, run_id: int, resources: list[RecordedResource], idempotency_key: str, backend: str = ""
    ) -> RevertAnswer:
        try:
            refs = registry.refs_of(resources)
        except ValueError as exc:
            return terminal(str(exc))
        shard = fleet.client(backend)  # the step's shard: an empty list too goes to it
        if not refs:
            # The step died (or its call timed out) before it recorded what it made:
            # whatever its key spawned is this step's to give back. The key is revoked
            # first, so a spawn still on its way to the shard cannot land afterwards.
            if not isinstance(idempotency_key, str) or not idempotency_key.strip():
                return {"ok": True, "failed": []}
            reply = shard.post(f"/spawns/{quote(idempotency_key, safe='')}/revoke", None)
            if not reply.ok:
                return reply.failure()
            reply = shard.get("/creatures", params={"key": idempotency_key})
            if not reply.ok:
                return reply.failure()
            creatures = reply.body.get("creatures")
            if not isinstance(creatures, list) or not all(
                isinstance(c, dict) and isinstance(c.get("ref"), str) for c in creatures
            ):
                return malformed("a list of creatures")
            refs = [c["ref"] for c in creatures]
        refused = {}
        for chunk in registry.chunks(refs, CHUNK):
            reply = shard.post("/despawn", {"refs": chunk})
            if not reply.ok:
                return reply.failure()  # what was despawned stays so: a retry is safe
            if not _str_list(reply.body.get("removed")) or not _str_list(reply.body.get("absent")):
                return malformed("a despawn")
            held = reply.body.get("refused", [])
            if not _str_list(held) or not set(held) <= set(chunk):
                return malformed("a despawn")
            reasons = reply.body.get("reasons") or {}
            if not isinstance(reasons, dict):
                return malformed("a despawn")
            for ref in held:
                why = reasons.get(ref)
                refused[ref] = f"refused: {why}" if isinstance(why, str) and why.strip() else "refused by the shard"
        # Removed or already absent: either way it is no longer in the world. A creature
        # the shard refused to let go is this row's own failure, not the shard's, and
        # each says why.
        return {"ok": True, "failed": refused}

    @never_raises
    def reconcile(self, *, run_id: int, resources: list[RecordedResource], backend: str = "") -> ReconcileAnswer:
        try:
            refs = registry.refs_of(resources)
        except ValueError as exc:
            return terminal(str(exc))
        shard = fleet.client(backend)
        present: set[str] = set()
        for chunk in registry.chunks(refs, CHUNK):
            reply = shard.post("/creatures/lookup", {"refs": chunk})
            if not reply.ok:
                return reply.failure()  # not knowing is a failure, never "all gone"
            found = reply.body.get("present")
            if not _str_list(found):
                return malformed("a lookup")
            present.update(found)
        return {"ok": True, "in_force": [ref for ref in refs if ref in present]}


class SpawnerRateLease(registry.Lease):
    """``sandbox.spawner_rate``: the rate of the spawner named by ``target``.

    In a fleet the target names its shard too, ``SHARD:SPAWNER`` (``north:orc-camp``);
    ``orc-camp`` alone is the spawner of the only shard. The same spawner on two shards is
    two targets, each with its own leases.
    """

    id = "sandbox.spawner_rate"
    module = MODULE
    budget_ms = 10_000

    def validate(self, value: Any) -> None:
        if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_RATE:
            raise ValueError(f"a spawner rate is a number from 0 to {MAX_RATE}, got {value!r}")

    def backend_of(self, target: str) -> str:
        """The shard a target is on, its backend: the one it names, or the only one."""
        return shard_of_target(target)

    @staticmethod
    def _where(target: object, backend: str = "") -> tuple[ShardClient, str]:
        """The client and the path of a target's spawner (ValueError for a bad target)."""
        shard, spawner = split_target(target)
        return client_for(backend, shard), "/spawners/" + quote(spawner, safe="")

    @never_raises
    def read(self, *, target: str, backend: str = "") -> ReadAnswer:
        try:
            shard, path = self._where(target, backend)
        except ValueError as exc:
            return terminal(str(exc))
        reply = shard.get(path)
        if not reply.ok:
            return reply.failure()
        if not _is_number(reply.body.get("rate")):
            return malformed("a spawner")
        return {"ok": True, "value": reply.body["rate"]}

    @never_raises
    def apply(
        self, *, value: Any, run_id: int, target: str, backend: str = "", session: str | None = None
    ) -> ApplyAnswer:
        try:
            shard, path = self._where(target, backend)
        except ValueError as exc:
            return terminal(str(exc))
        if not _is_number(value):
            return terminal(f"a spawner rate must be a number, not {value!r}")
        reply = shard.put(path, {"rate": value, **({"session": session} if session else {})})
        return {"ok": True} if reply.ok else reply.failure()

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
        try:
            shard, path = self._where(target, backend)
        except ValueError as exc:
            return terminal(str(exc))
        if not _is_number(baseline) or not _is_number(expected):
            return terminal(f"baseline and expected must be numbers, not {baseline!r}, {expected!r}")
        # Conditional: the shard changes the rate only while it still is what we applied.
        # Under the session, a rate put back to its baseline is off the shard's switch.
        body = {"rate": baseline, "expected": expected, **({"session": session} if session else {})}
        reply = shard.put(path, body)
        if reply.ok:
            return {"ok": True}
        if reply.status == 409 and "current" in reply.body:
            current = reply.body["current"]
            if current == baseline:
                return {"ok": True}  # already put back (by an earlier call that landed late)
            return {"ok": False, "drifted": True, "current": current}
        return reply.failure()


def _lapse(lapsed: object, backend: str) -> KeepaliveAnswer | None:
    """The shard's record of a lapsed session as the engine reads it: ledger refs given
    back and kept. A spawner is a lease's target, named with its shard in a fleet (both
    spellings are given: a site of one named shard may name its spawners bare)."""
    if not isinstance(lapsed, dict):
        return None
    given, kept = lapsed.get("given_back"), lapsed.get("kept")
    if not isinstance(given, dict) or not isinstance(kept, dict):
        return None
    creatures, spawners = given.get("creatures"), given.get("spawners")
    kept_creatures, kept_spawners = kept.get("creatures"), kept.get("spawners")
    if not isinstance(creatures, list) or not _str_list(creatures):
        return None
    if not isinstance(spawners, dict) or not isinstance(kept_creatures, dict) or not isinstance(kept_spawners, dict):
        return None
    return registry.lapsed(
        given_back=[*creatures, *(r for name in spawners for r in _lease_refs(str(name), backend))],
        kept={
            **{str(ref): str(why) for ref, why in kept_creatures.items()},
            **{r: str(why) for name, why in kept_spawners.items() for r in _lease_refs(str(name), backend)},
        },
        at=lapsed.get("at"),
        silent_s=lapsed.get("silent_s"),
    )


def _lease_refs(spawner: str, backend: str) -> list[str]:
    targets = [f"{backend}{TARGET_SHARD}{spawner}", spawner] if backend else [spawner]
    return [registry.lease_ref(SpawnerRateLease.id, target) for target in targets]


SPAWN = SpawnAction()
SPAWNER_RATE = SpawnerRateLease()
