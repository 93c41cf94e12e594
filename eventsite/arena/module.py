"""The ``arena`` module: bots and cvars on OpenArena (ioquake3) servers, given back when runs end.

- ``arena.bots`` (``{"count": 3, "skill": 2, "shard": "north"}``) adds bots with ``addbot``,
  each named after the step's key (``e`` + the key's short form + its number, such as
  ``e7kq2mzva01``), so a retried perform adds only the bots that are not there yet and a
  revert handed nothing finds by name what the key made. ``revert`` kicks by name (a bot
  not on the server is given back too); ``reconcile`` answers the bots ``status`` lists.
- ``arena.cvar`` leases any server cvar on the target ``SERVER:cvar`` (``north:g_gravity``):
  ``read``, ``apply`` (``set``) and a ``restore`` that reads and sets only over the value
  this run applied, reporting drift. Its ``value_type`` reads a cvar's text as a number when
  it is one, so ``"300"`` read back is the lease's 300.
- ``health(backend=...)`` answers the server's boot id (`rcon.boot_id`): a token the module
  sets in the server info at first contact, with the map and its load time.

A step's backend is the server its ``shard`` param names (``ARENA_SERVERS``).
May import: `cleanup.registry`, `cleanup.envelopes` and the module's own parts.
"""

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

from . import rcon
from .rcon import Server, ServerError

MODULE = rcon.MODULE
MAX_COUNT = 10
CHARACTER = "sarge"
BOT_PARAMS = ("count", "skill", "shard")
BOT_NAME = re.compile(r"^e[a-z2-7]{8}[0-9]{2}\Z")
TEXT_VALUE = re.compile(r"^[A-Za-z0-9._-]{0,64}\Z")
# Never leased: the server's secrets, and the module's own boot cvar.
FORBIDDEN = re.compile(r"password|^eventsite_boot$", re.IGNORECASE)
# At most three requests a call, each of ARENA_TIMEOUT_MS, waiting their turns: well inside.
LEASE_BUDGET_MS = 15_000


def bot_prefix(idempotency_key: str) -> str:
    return "e" + registry.short_key(idempotency_key, 8)


def bot_names(idempotency_key: str, count: int) -> list[str]:
    prefix = bot_prefix(idempotency_key)
    return [f"{prefix}{n:02d}" for n in range(1, count + 1)]


def _shard_of(resources: object) -> str:
    for item in resources if isinstance(resources, list | tuple) else ():
        payload = item.get("payload") if isinstance(item, dict) else None
        shard = payload.get("shard") if isinstance(payload, dict) else None
        if isinstance(shard, str):
            return shard
    return ""


def _bots(target: Server) -> tuple[set[str] | None, Failure | None]:
    """The names of the bots on the server now, or the failure that says why not."""
    reply = rcon.command(target, "status")
    if not reply.ok:
        return None, reply.failure()
    found = rcon.players(reply.text)
    if found is None:
        return None, registry.retry(f"{target.label} runs no map: {reply.text.strip()[:200]}")
    return {name for name, address in found if address == "bot"}, None


def _health(backend: str) -> HealthAnswer:
    try:
        target = rcon.server(backend)
    except ServerError as exc:
        return terminal(str(exc))
    reply = rcon.boot_id(target)
    if not reply.ok:
        return cast(HealthAnswer, reply.failure())
    rcon.boot_watch.saw(target, reply.text)
    return {"ok": True, "boot_id": reply.text}


class BotsAction(registry.Action):
    """``arena.bots``: ``{"count": 3, "skill": 2, "shard": "north"}``."""

    id = "arena.bots"
    module = MODULE
    # Up to MAX_COUNT + 1 requests, one a second once the server's burst is spent.
    budget_ms = 40_000
    max_rate = 2.0
    max_burst = 8

    def validate(self, params: dict[str, Any]) -> None:
        if not isinstance(params, dict):
            raise ValueError("params must be an object with count (and skill, shard)")
        unknown = sorted(set(params) - set(BOT_PARAMS))
        if unknown:
            raise ValueError(f"{unknown[0]} is not a parameter of {self.id}")
        count = params.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise ValueError(f"count must be a whole number from 1 to {MAX_COUNT}")
        skill = params.get("skill", 2)
        if isinstance(skill, bool) or not isinstance(skill, int) or not 1 <= skill <= 5:
            raise ValueError("skill must be a whole number from 1 to 5")
        if "shard" in params:
            rcon.backend_named(params["shard"])

    def backend_of(self, params: dict[str, Any]) -> str:
        return rcon.backend_named(params.get("shard") if isinstance(params, dict) else None)

    @never_raises
    def health(self, *, backend: str = "") -> HealthAnswer:
        """The server answers rcon, with the identity of what it holds."""
        return _health(backend)

    @never_raises
    def perform(
        self, *, run_id: int, step_id: int, params: dict[str, Any], idempotency_key: str, backend: str = ""
    ) -> PerformAnswer:
        try:
            self.validate(params)
        except ValueError as exc:
            return terminal(str(exc))
        if not isinstance(idempotency_key, str) or not idempotency_key:
            return terminal("the step has no idempotency key")
        try:
            named = self.backend_of(params)
            if backend and backend != named:
                return terminal(f"the step is for the server {backend!r}, its params name {named!r}")
            target = rcon.server(backend or named)
        except (ServerError, ValueError) as exc:
            return terminal(str(exc))
        names = bot_names(idempotency_key, params["count"])
        present, failure = _bots(target)
        if failure is not None or present is None:
            return cast(PerformAnswer, failure)
        for name in names:
            if name in present:
                continue  # added by an earlier attempt under this key
            reply = rcon.command(target, f"addbot {CHARACTER} {params.get('skill', 2)} free 0 {name}")
            if not reply.ok:
                return cast(PerformAnswer, reply.failure())
            if f"n\\{name}\\" not in reply.text:
                said = reply.text.strip().splitlines()[-1:] or ["nothing"]
                return registry.retry(f"{target.label} did not add the bot {name}: {said[0][:200]}")
        payload = {"shard": target.name, "skill": params.get("skill", 2), "idempotency_key": idempotency_key}
        resources: list[ResourceEntry] = [{"kind": "bot", "ref": name, "payload": payload} for name in names]
        return {"ok": True, "resources": resources}

    @never_raises
    def revert(
        self, *, run_id: int, resources: list[RecordedResource], idempotency_key: str, backend: str = ""
    ) -> RevertAnswer:
        try:
            refs = registry.refs_of(resources)
            target = rcon.server(backend or _shard_of(resources))
        except (ServerError, ValueError) as exc:
            return terminal(str(exc))
        if not refs:
            # Nothing recorded: whatever the key made is the step's to give back.
            if not isinstance(idempotency_key, str) or not idempotency_key:
                return {"ok": True, "failed": []}
            present, failure = _bots(target)
            if failure is not None or present is None:
                return cast(RevertAnswer, failure)
            prefix = bot_prefix(idempotency_key)
            mine = sorted(n for n in present if n.startswith(prefix) and BOT_NAME.match(n))
            refused = self._kick(target, mine)
            if isinstance(refused, dict) and "ok" in refused:
                return cast(RevertAnswer, refused)
            if refused:
                reasons = "; ".join(f"{ref}: {why}" for ref, why in refused.items())
                return registry.retry(f"{target.label} kept bots the key made: {reasons}")
            return {"ok": True, "failed": []}
        answer = self._kick(target, refs)
        if isinstance(answer, dict) and "ok" in answer:
            return cast(RevertAnswer, answer)
        return {"ok": True, "failed": cast(dict[str, str], answer)}

    @staticmethod
    def _kick(target: Server, refs: list[str]) -> dict[str, Any]:
        """``{ref: reason}`` of the bots not given back; a failure envelope when the server
        could not be asked (what was kicked stays so: a retry is safe)."""
        refused: dict[str, str] = {}
        for ref in refs:
            if not BOT_NAME.match(ref):
                refused[ref] = "not the name of a bot this module adds, so it was left alone"
                continue
            reply = rcon.command(target, f"kick {ref}")
            if not reply.ok:
                return dict(reply.failure())
            text = reply.text
            if "was kicked" in text or "is not on the server" in text or "ClientDisconnect" in text:
                continue  # kicked, or already gone: both are given back
            refused[ref] = f"{target.label} said: {text.strip()[:200] or 'nothing'}"
        return refused

    @never_raises
    def reconcile(self, *, run_id: int, resources: list[RecordedResource], backend: str = "") -> ReconcileAnswer:
        try:
            refs = registry.refs_of(resources)
            target = rcon.server(backend or _shard_of(resources))
        except (ServerError, ValueError) as exc:
            return terminal(str(exc))
        present, failure = _bots(target)
        if failure is not None or present is None:
            return cast(ReconcileAnswer, failure)  # not knowing is never "all gone"
        return {"ok": True, "in_force": [ref for ref in refs if ref in present]}


def cvar_value(text: Any) -> Any:
    """A cvar's text as the value it stands for: a whole number, a number, else the text
    (a value that is no text already is one: it is answered as it is)."""
    if not isinstance(text, str):
        return text
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _text_of(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class CvarLease(registry.Lease):
    """``arena.cvar``: any server cvar, on the target ``SERVER:cvar`` (``north:g_gravity``)."""

    id = "arena.cvar"
    module = MODULE
    budget_ms = LEASE_BUDGET_MS
    max_rate = 2.0
    max_burst = 8
    value_type = staticmethod(cvar_value)

    def validate(self, value: Any) -> None:
        if isinstance(value, bool) or value is None:
            raise ValueError(f"a cvar's value is a number or a word, not {value!r}")
        if isinstance(value, int | float):
            if not math.isfinite(value):
                raise ValueError(f"a cvar's value must be a finite number, not {value!r}")
            return
        if not isinstance(value, str) or not TEXT_VALUE.match(value):
            raise ValueError("a cvar's text value is letters, digits, '.', '_' or '-' (at most 64)")

    def backend_of(self, target: str) -> str:
        name, cvar = rcon.split_target(target)
        if FORBIDDEN.search(cvar):
            raise ValueError(f"target: the cvar {cvar!r} may not be leased")
        return rcon.backend_named(name)

    @never_raises
    def health(self, *, backend: str = "") -> HealthAnswer:
        return _health(backend)

    def _where(self, target: object, backend: str) -> tuple[Server, str]:
        name, cvar = rcon.split_target(target)
        if FORBIDDEN.search(cvar):
            raise ValueError(f"the cvar {cvar!r} may not be leased")
        if backend and name is not None and name != backend:
            raise ValueError(f"the target names the server {name!r}, the call is for {backend!r}")
        return rcon.server(backend or rcon.backend_named(name)), cvar

    @staticmethod
    def _current(target: Server, cvar: str) -> tuple[Any, Failure | None]:
        reply = rcon.command(target, cvar)
        if not reply.ok:
            return None, reply.failure()
        text = rcon.cvar_value(reply.text, cvar)
        if text is None:
            return None, terminal(f"{target.label} has no cvar named {cvar!r}")
        return cvar_value(text), None

    @staticmethod
    def _set(target: Server, cvar: str, value: Any) -> Failure | None:
        reply = rcon.command(target, f"set {cvar} {_text_of(value)}")
        if not reply.ok:
            return reply.failure()
        said = reply.text.strip()
        if said:  # "… is read only.", "… will be changed upon restarting.", "… is cheat protected."
            return terminal(f"{target.label} did not set {cvar}: {said[:200]}")
        return None

    @never_raises
    def read(self, *, target: str, backend: str = "") -> ReadAnswer:
        try:
            server, cvar = self._where(target, backend)
        except (ServerError, ValueError) as exc:
            return terminal(str(exc))
        value, failure = self._current(server, cvar)
        if failure is not None:
            return cast(ReadAnswer, failure)
        return {"ok": True, "value": value}

    @never_raises
    def apply(self, *, value: Any, run_id: int, target: str, backend: str = "") -> ApplyAnswer:
        try:
            self.validate(value)
            server, cvar = self._where(target, backend)
        except (ServerError, ValueError) as exc:
            return terminal(str(exc))
        failure = self._set(server, cvar, value)
        return cast(ApplyAnswer, failure) if failure is not None else {"ok": True}

    @never_raises
    def restore(self, *, baseline: Any, expected: Any, run_id: int, target: str, backend: str = "") -> RestoreAnswer:
        try:
            self.validate(baseline)
            server, cvar = self._where(target, backend)
        except (ServerError, ValueError) as exc:
            return terminal(str(exc))
        # rcon has no compare-and-set: read, then set only over the value this run applied.
        # Somebody's `set` between the two requests (a fraction of a second) would be undone.
        current, failure = self._current(server, cvar)
        if failure is not None:
            return cast(RestoreAnswer, failure)
        if current == cvar_value(_text_of(baseline)):
            return {"ok": True}
        if current != cvar_value(_text_of(expected)):
            return {"ok": False, "drifted": True, "current": current}
        failure = self._set(server, cvar, baseline)
        return cast(RestoreAnswer, failure) if failure is not None else {"ok": True}


BOTS = BotsAction()
CVAR = CvarLease()
