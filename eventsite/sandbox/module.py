"""The ``sandbox`` module: spawn creatures on the sandbox shard, lease a spawner's rate.

This is the worked example of a module (see ``docs/modules.md``). What it shows:

- every callable answers an envelope and never raises (`never_raises`);
- ``perform`` sends the step's idempotency key with the spawn, so a retried step, or a
  call that timed out here but landed on the shard, spawns once;
- ``revert`` gives back what it is handed, counts "already gone" as given back, names
  the creatures the shard refused to despawn as ``failed`` (the row's own failure), and when
  it is handed nothing (the step's worker died before recording) finds what the key
  spawned and gives that back;
- ``reconcile`` says which refs the shard still has, and fails when it cannot tell;
- the lease restores only over the value it applied (``expected``) and reports drift;
- the client (`eventsite.sandbox.client`) maps transport errors and 5xx to ``retry:
  True``, 4xx to ``retry: False``, and reports a shard restart to the engine.
"""

import functools
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast
from urllib.parse import quote

from cleanup import registry
from cleanup.envelopes import (
    ApplyAnswer,
    Failure,
    HealthAnswer,
    PerformAnswer,
    ReadAnswer,
    ReconcileAnswer,
    RecordedResource,
    RestoreAnswer,
    RevertAnswer,
)

from .client import ShardClient

logger = logging.getLogger(__name__)

MODULE = "sandbox"
MAX_COUNT = 500
MAX_TEXT = 200
MAX_RATE = 1_000_000  # what the shard accepts (eventsite.sandbox.shard)
CHUNK = 500  # refs per despawn or lookup request (the shard takes up to 1000)
SPAWN_PARAMS = ("creature", "count", "at")

shard = ShardClient(MODULE)

_Method = TypeVar("_Method", bound=Callable[..., Any])


def never_raises(method: _Method) -> _Method:
    """A module callable's exception becomes a failure envelope (to retry) instead."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            logger.exception("%s.%s failed", self.id, method.__name__)
            return {
                "ok": False,
                "error": f"{self.id} {method.__name__} failed: {type(exc).__name__}: {exc}",
                "retry": True,
            }

    return cast(_Method, wrapper)


def terminal(error: str) -> Failure:
    return {"ok": False, "error": error, "retry": False}


def malformed(what: str) -> Failure:
    return {
        "ok": False,
        "error": f"the shard answered {what} in a shape it should not",
        "retry": True,
    }


def _text(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{name} must be at most {MAX_TEXT} characters")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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


def _chunks(refs: list[str]) -> list[list[str]]:
    return [refs[i : i + CHUNK] for i in range(0, len(refs), CHUNK)]


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


class SpawnAction(registry.Action):
    """``sandbox.spawn``: ``{"creature": "orc", "count": 20, "at": "north-gate"}``."""

    id = "sandbox.spawn"
    module = MODULE
    # Each request has its own timeout (SANDBOX_SHARD_TIMEOUT_MS, 3 s); a revert makes
    # at most a lookup and a despawn per chunk, well inside the budget.
    budget_ms = 10_000

    def validate(self, params: dict[str, Any]) -> None:
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

    @never_raises
    def health(self, *, backend: str = "") -> HealthAnswer:
        """Does the shard answer game requests? The engine probes it while it is down."""
        reply = shard.get("/spawners")
        return {"ok": True} if reply.ok else reply.failure()

    @never_raises
    def perform(self, *, run_id: int, step_id: int, params: dict[str, Any], idempotency_key: str) -> PerformAnswer:
        try:
            self.validate(params)
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
    def revert(self, *, run_id: int, resources: list[RecordedResource], idempotency_key: str) -> RevertAnswer:
        try:
            refs = _refs_of(resources)
        except ValueError as exc:
            return terminal(str(exc))
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
        for chunk in _chunks(refs):
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
    def reconcile(self, *, run_id: int, resources: list[RecordedResource]) -> ReconcileAnswer:
        try:
            refs = _refs_of(resources)
        except ValueError as exc:
            return terminal(str(exc))
        present = set()
        for chunk in _chunks(refs):
            reply = shard.post("/creatures/lookup", {"refs": chunk})
            if not reply.ok:
                return reply.failure()  # not knowing is a failure, never "all gone"
            found = reply.body.get("present")
            if not _str_list(found):
                return malformed("a lookup")
            present.update(found)
        return {"ok": True, "in_force": [ref for ref in refs if ref in present]}


class SpawnerRateLease(registry.Lease):
    """``sandbox.spawner_rate``: the rate of the spawner named by ``target``."""

    id = "sandbox.spawner_rate"
    module = MODULE
    budget_ms = 10_000

    def validate(self, value: Any) -> None:
        if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_RATE:
            raise ValueError(f"a spawner rate is a number from 0 to {MAX_RATE}, got {value!r}")

    @staticmethod
    def _path(target: object) -> str:
        if not isinstance(target, str) or not target.strip():
            raise ValueError("target must name a spawner")
        return "/spawners/" + quote(target, safe="")

    @never_raises
    def read(self, *, target: str) -> ReadAnswer:
        try:
            path = self._path(target)
        except ValueError as exc:
            return terminal(str(exc))
        reply = shard.get(path)
        if not reply.ok:
            return reply.failure()
        if not _is_number(reply.body.get("rate")):
            return malformed("a spawner")
        return {"ok": True, "value": reply.body["rate"]}

    @never_raises
    def apply(self, *, value: Any, run_id: int, target: str) -> ApplyAnswer:
        try:
            path = self._path(target)
        except ValueError as exc:
            return terminal(str(exc))
        if not _is_number(value):
            return terminal(f"a spawner rate must be a number, not {value!r}")
        reply = shard.put(path, {"rate": value})
        return {"ok": True} if reply.ok else reply.failure()

    @never_raises
    def restore(self, *, baseline: Any, expected: Any, run_id: int, target: str) -> RestoreAnswer:
        try:
            path = self._path(target)
        except ValueError as exc:
            return terminal(str(exc))
        if not _is_number(baseline) or not _is_number(expected):
            return terminal(f"baseline and expected must be numbers, not {baseline!r}, {expected!r}")
        # Conditional: the shard changes the rate only while it still is what we applied.
        reply = shard.put(path, {"rate": baseline, "expected": expected})
        if reply.ok:
            return {"ok": True}
        if reply.status == 409 and "current" in reply.body:
            current = reply.body["current"]
            if current == baseline:
                return {"ok": True}  # already put back (by an earlier call that landed late)
            return {"ok": False, "drifted": True, "current": current}
        return reply.failure()


SPAWN = SpawnAction()
SPAWNER_RATE = SpawnerRateLease()
