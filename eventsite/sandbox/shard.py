"""The sandbox shard: a stand-in game shard over HTTP and JSON, for tests and demos.

Run it with ``python manage.py sandbox_shard [--host 127.0.0.1] [--port 7777]
[--save-every 30]`` or, without Django at all, ``python -m eventsite.sandbox.shard``
with the same options (``--port 0`` lets the system pick a free port; the line printed
at start names the URL actually bound). It uses the standard library only and never
touches a database.

The world lives in memory, behind one lock: creatures (``ref``, ``kind``, ``at`` and the
idempotency ``key`` of the event spawn that made them, ``null`` for the shard's own
ambient creatures) and named spawners with a rate. Like a real shard it *saves* its
world, every ``--save-every`` seconds (0: never on its own) and on ``POST /save``; the
save is a snapshot in memory. A *restart* takes a new boot id and either rolls the world
back to the last save, as a crashed shard does (creatures spawned since are gone,
creatures despawned since are back, rates are as saved), or, in ``wipe`` mode, forgets
every event spawn (from the world and from the save) and keeps the rates.

Every answer is a JSON object and carries the header ``X-Boot-Id``: a client that
remembers it sees the shard restart. A failure answers ``{"error": "..."}`` (and
``"field"`` when one field is at fault).

Game routes (subject to the injected faults):

=======  ========================  ==================================================
GET      /health                   ``{"boot_id", "started_at", "saved_at",
                                   "creatures"}``
POST     /spawn                    ``{"key", "creature", "count" (1..500), "at"}``:
                                   201 ``{"key", "replayed": false, "creatures":
                                   [...], "despawned": []}``. Idempotent per key: the
                                   same call again answers 200 with the same creatures,
                                   ``replayed: true``, and spawns nothing (``despawned``
                                   names those gone since). The key with other
                                   ``creature``/``count``/``at`` answers 409.
POST     /despawn                  ``{"refs": [...]}`` (at most 1000): 200
                                   ``{"removed": [...], "absent": [...],
                                   "refused": [...]}``, and ``"reasons": {ref: why}``
                                   when some were refused. A ref already gone is no
                                   error: it is listed as absent. A creature the
                                   ``stuck`` fault names stays in the world and is
                                   listed as refused, with its reason ("the wolf is
                                   in combat").
GET      /creatures[?key=K]        ``{"creatures": [{"ref", "kind", "at", "key"}]}``,
                                   those spawned under K, or all of them.
POST     /spawns/KEY/revoke        ``{"key", "revoked": true}``: no spawn under KEY
                                   happens any more (``/spawn`` with it answers 409),
                                   so a spawn still on its way cannot land after the
                                   engine gave the key's creatures back. Despawns
                                   nothing: that is ``/despawn``'s job.
POST     /creatures/lookup         ``{"refs": [...]}``: ``{"present": [...],
                                   "absent": [...]}``, which of those refs exist.
GET      /spawners                 ``{"spawners": [{"name", "rate"}]}``
GET      /spawners/NAME            ``{"name", "rate"}``; 404 when there is no such
                                   spawner (yet).
PUT      /spawners/NAME            ``{"rate", "expected"?}``: ``{"name", "rate",
                                   "previous"}``. With ``expected`` the change is
                                   conditional: when the rate in force is not
                                   ``expected`` it answers 409 ``{"error",
                                   "current"}`` and changes nothing.
POST     /keepalive                ``{"session", "ttl_s"}`` (1..604800): arms or
                                   renews the core's session, ``{"session", "ttl_s",
                                   "holds"}``; a session whose switch went off answers
                                   ``{"session", "lapsed": {...}}`` (see below).
=======  ========================  ==================================================

``/spawn`` and ``PUT /spawners/NAME`` take an optional ``"session"``: what they take is
filed under it (the spawn's key; the spawner's rate from before the session's first
change, its baseline, and the rate last set). A session must be armed by ``/keepalive``
first, and one that lapsed takes nothing more (409). A ``PUT`` under the session that puts
the baseline back takes the spawner off the session.

The dead-man's switch: a session that hears no ``/keepalive`` for ``ttl_s`` seconds lapses,
and the shard gives back, by itself, everything filed under it, as the core would: each
key is revoked and its creatures still in the world despawned (a ``stuck`` creature is
kept, with its reason), and each spawner whose rate is still the one last set under the
session goes back to its baseline (one changed by somebody else is kept, with its reason).
It remembers what it did: ``{"at", "ttl_s", "silent_s", "given_back": {"creatures":
[refs], "spawners": {name: baseline}}, "kept": {"creatures": {ref: why}, "spawners":
{name: why}}}``, answered to the session's next ``/keepalive`` and to ``GET /switch``.

Harness routes (never subject to faults, so a test can always steer the shard):

=======  ========================  ==================================================
GET      /faults                   ``{"latency_ms", "error_rate", "down", "stuck"}``
POST     /faults                   any of ``latency_ms`` (0..60000), ``error_rate``
                                   (0..1: that share of game requests answers 503
                                   before doing anything), ``down`` (``false``,
                                   ``"refuse"``: game requests get their connection
                                   reset without an answer, as from a dead process;
                                   ``"503"``: game requests answer 503), ``stuck``
                                   (creature refs or kinds, such as ``["wolf"]``, at
                                   most 100: those creatures refuse to be despawned,
                                   while the shard answers everything else). Fields
                                   left out keep their value; answers the faults in
                                   force.
DELETE   /faults                   clear every fault.
POST     /drift                    ``{"spawner", "rate"}``: change (or create) a
                                   spawner's rate behind the engine's back.
POST     /save                     save the world now: ``{"saved_at", "creatures"}``.
GET      /switch                   ``{"sessions": [{"session", "ttl_s", "silent_s",
                                   "keys", "spawners", "lapsed"}]}``: each session and
                                   what its switch gave back, if it went off.
POST     /restart                  ``{"mode": "rollback" | "wipe"}`` (body optional,
                                   rollback by default): ``{"boot_id",
                                   "previous_boot_id", "mode"}``. Faults are kept:
                                   they belong to the harness, not to the world.
=======  ========================  ==================================================

Latency holds every answer of a game route back *after* the work is done, as a slow
shard does: a client that gives up has still changed the world, which is why every call
carries a key or an expected value. Injected 503s (``error_rate``, ``down: "503"``) and
refused connections do nothing.

Bad input (bad JSON, a missing, unknown or ill-typed field, a count out of range)
answers 400 naming the field; an unknown route 404; a known route with another method
405. No input crashes the server: an unexpected error answers 500.
"""

import argparse
import copy
import json
import math
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7777
DEFAULT_SAVE_EVERY_S = 30.0

INITIAL_SPAWNERS = {"orc-camp": 1.0, "goblin-cave": 2.0, "wolf-den": 0.5}
# The shard's own creatures, spawned by no event: a wipe keeps them.
AMBIENT = [("wolf", "wolf-den"), ("wolf", "wolf-den"), ("orc", "orc-camp")]

MAX_COUNT = 500
MAX_REFS = 1000
MAX_TEXT = 200
MAX_RATE = 1_000_000
MAX_LATENCY_MS = 60_000
MAX_STUCK = 100
MAX_BODY_BYTES = 1_000_000
MAX_TTL_S = 7 * 86_400
# How often the switch looks for sessions that went quiet.
SWITCH_EVERY_S = 0.2
RESTART_MODES = ("rollback", "wipe")
SPAWNER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class BadRequest(Exception):
    """A request the shard refuses; answered as ``{"error": message}`` with a status."""

    def __init__(self, message, status=400, field=None, **extra):
        super().__init__(message)
        self.status = status
        self.body = {"error": message, **({"field": field} if field else {}), **extra}


def _now():
    return time.time()


def _new_ref():
    return "cr-" + uuid.uuid4().hex[:16]


# -- request validation -----------------------------------------------------------------


def _require_object(body):
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _only(body, allowed):
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}", field=unknown[0])


def _text(body, name):
    if name not in body:
        raise BadRequest(f"{name} is required", field=name)
    value = body[name]
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{name} must be a non-empty string", field=name)
    if len(value) > MAX_TEXT:
        raise BadRequest(f"{name} must be at most {MAX_TEXT} characters", field=name)
    return value


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _rate(body, name, required=True):
    if name not in body:
        if required:
            raise BadRequest(f"{name} is required", field=name)
        return None
    value = body[name]
    if not _is_number(value) or not 0 <= value <= MAX_RATE:
        raise BadRequest(f"{name} must be a number from 0 to {MAX_RATE}", field=name)
    return float(value)


def _refs(body):
    if "refs" not in body:
        raise BadRequest("refs is required", field="refs")
    refs = body["refs"]
    if not isinstance(refs, list):
        raise BadRequest("refs must be a list of creature refs", field="refs")
    if len(refs) > MAX_REFS:
        raise BadRequest(f"refs may name at most {MAX_REFS} creatures", field="refs")
    for ref in refs:
        if not isinstance(ref, str) or not ref.strip():
            raise BadRequest("refs must hold only non-empty strings", field="refs")
    return list(dict.fromkeys(refs))  # each ref once, in the order given


# -- the world ---------------------------------------------------------------------------


class World:
    """The shard's state. Every method takes the lock; none of them sleeps."""

    def __init__(self):
        self.lock = threading.Lock()
        self.creatures = {}  # ref -> {"ref", "kind", "at", "key"}
        self.spawns = {}  # key -> {"creature", "count", "at", "records": [creature]}
        self.revoked = set()  # keys given back: they spawn nothing more
        self.spawners = dict(INITIAL_SPAWNERS)
        for kind, at in AMBIENT:
            ref = _new_ref()
            self.creatures[ref] = {"ref": ref, "kind": kind, "at": at, "key": None}
        self.faults = {"latency_ms": 0, "error_rate": 0.0, "down": False, "stuck": []}
        # The core's sessions (the dead-man's switch): kept across a restart, as the
        # switch's own record must outlive what it guards.
        self.sessions = {}
        self.boot_id = str(uuid.uuid4())
        self.started_at = _now()
        self._snapshot = None
        self.saved_at = None
        self.save()

    # state that a save keeps and a rollback restores
    def _state(self):
        return copy.deepcopy((self.creatures, self.spawns, self.spawners, self.revoked))

    def save(self):
        with self.lock:
            self._snapshot = self._state()
            self.saved_at = _now()
            return {"saved_at": self.saved_at, "creatures": len(self.creatures)}

    def health(self):
        with self.lock:
            return {
                "boot_id": self.boot_id,
                "started_at": self.started_at,
                "saved_at": self.saved_at,
                "creatures": len(self.creatures),
            }

    def restart(self, mode):
        with self.lock:
            previous = self.boot_id
            if mode == "rollback":
                self.creatures, self.spawns, self.spawners, self.revoked = copy.deepcopy(self._snapshot)
            else:  # wipe: forget every event spawn, in the world and in the save
                creatures, _, spawners, revoked = self._snapshot
                self._snapshot = (
                    {r: c for r, c in creatures.items() if c["key"] is None},
                    {},
                    spawners,
                    revoked,
                )
                self.creatures = {r: c for r, c in self.creatures.items() if c["key"] is None}
                self.spawns = {}
            self.boot_id = str(uuid.uuid4())
            self.started_at = _now()
            return {"boot_id": self.boot_id, "previous_boot_id": previous, "mode": mode}

    def spawn(self, key, creature, count, at, session=None):
        """``(created, answer)``: created is False when the key had already spawned."""
        with self.lock:
            filed = self._session_for(session)
            if key in self.revoked:
                raise BadRequest(f"key {key!r} was given back; it spawns nothing more", status=409, field="key")
            done = self.spawns.get(key)
            if done is not None:
                if (done["creature"], done["count"], done["at"]) != (creature, count, at):
                    raise BadRequest(
                        f"key {key!r} already spawned {done['count']} {done['creature']} "
                        f"at {done['at']!r}; a key names one spawn",
                        status=409,
                        field="key",
                    )
                records = copy.deepcopy(done["records"])
                gone = [c["ref"] for c in records if c["ref"] not in self.creatures]
                return False, {
                    "key": key,
                    "replayed": True,
                    "creatures": records,
                    "despawned": gone,
                }
            if filed is not None:
                filed["keys"].add(key)
            records = []
            for _ in range(count):
                ref = _new_ref()
                record = {"ref": ref, "kind": creature, "at": at, "key": key}
                self.creatures[ref] = record
                records.append(dict(record))
            self.spawns[key] = {
                "creature": creature,
                "count": count,
                "at": at,
                "records": records,
            }
            return True, {
                "key": key,
                "replayed": False,
                "creatures": copy.deepcopy(records),
                "despawned": [],
            }

    def revoke(self, key):
        with self.lock:
            self.revoked.add(key)
        return {"key": key, "revoked": True}

    def despawn(self, refs):
        with self.lock:
            stuck = set(self.faults["stuck"])
            refused = [ref for ref in refs if ref in self.creatures and self._stuck(self.creatures[ref], stuck)]
            held = set(refused)
            removed = [ref for ref in refs if ref not in held and self.creatures.pop(ref, None) is not None]
            reasons = {ref: f"the {self.creatures[ref]['kind']} is in combat" for ref in refused}
        there = set(removed) | held
        answer = {"removed": removed, "absent": [ref for ref in refs if ref not in there], "refused": refused}
        return {**answer, "reasons": reasons} if reasons else answer

    @staticmethod
    def _stuck(creature, stuck):
        return creature["ref"] in stuck or creature["kind"] in stuck

    def lookup(self, refs):
        with self.lock:
            present = [ref for ref in refs if ref in self.creatures]
        there = set(present)
        return {"present": present, "absent": [ref for ref in refs if ref not in there]}

    def list_creatures(self, key=None):
        with self.lock:
            return [dict(c) for c in self.creatures.values() if key is None or c["key"] == key]

    def list_spawners(self):
        with self.lock:
            return [{"name": n, "rate": r} for n, r in sorted(self.spawners.items())]

    def spawner(self, name):
        with self.lock:
            if name not in self.spawners:
                raise BadRequest(f"no spawner is named {name!r}", status=404)
            return {"name": name, "rate": self.spawners[name]}

    def set_rate(self, name, rate, expected=None, create=False, session=None):
        with self.lock:
            filed = self._session_for(session)
            if name not in self.spawners and not create:
                raise BadRequest(f"no spawner is named {name!r}", status=404)
            previous = self.spawners.get(name)
            if expected is not None and previous != expected:
                raise BadRequest(
                    f"the rate of {name!r} is {previous!r}, not the expected {expected!r}",
                    status=409,
                    field="expected",
                    current=previous,
                )
            self.spawners[name] = rate
            if filed is not None:
                self._file_rate(filed, name, previous, rate)
            return {"name": name, "rate": rate, "previous": previous}

    # -- the dead-man's switch (every method below but `keepalive` and `switch` runs
    # under the lock) --

    def _session_for(self, session):
        """The session's record to file under, or None when the call names none."""
        if session is None:
            return None
        filed = self.sessions.get(session)
        if filed is None:
            raise BadRequest(f"no session {session!r}: arm it with /keepalive first", status=409, field="session")
        if filed["lapsed"] is not None:
            raise BadRequest(
                f"session {session!r} lapsed: its switch gave back what it held",
                status=409,
                field="session",
                lapsed=filed["lapsed"],
            )
        return filed

    @staticmethod
    def _file_rate(filed, name, previous, rate):
        held = filed["spawners"].get(name)
        if held is None:
            filed["spawners"][name] = {"baseline": previous, "applied": rate}
        elif rate == held["baseline"]:
            del filed["spawners"][name]  # the core put the baseline back itself
        else:
            held["applied"] = rate

    def keepalive(self, session, ttl_s):
        with self.lock:
            filed = self.sessions.get(session)
            if filed is not None and filed["lapsed"] is not None:
                return {"session": session, "lapsed": copy.deepcopy(filed["lapsed"])}
            if filed is None:
                filed = self.sessions[session] = {"keys": set(), "spawners": {}, "lapsed": None}
            filed["ttl_s"] = ttl_s
            filed["renewed"] = time.monotonic()
            return {"session": session, "ttl_s": ttl_s, "holds": self._holds(filed)}

    def _holds(self, filed):
        creatures = sum(1 for c in self.creatures.values() if c["key"] in filed["keys"])
        return {"keys": len(filed["keys"]), "creatures": creatures, "spawners": sorted(filed["spawners"])}

    def switch(self):
        """Each session, what it holds, and what its switch gave back if it went off."""
        now = time.monotonic()
        with self.lock:
            return {
                "sessions": [
                    {
                        "session": session,
                        "ttl_s": filed["ttl_s"],
                        "silent_s": round(now - filed["renewed"], 3),
                        "holds": self._holds(filed),
                        "lapsed": copy.deepcopy(filed["lapsed"]),
                    }
                    for session, filed in self.sessions.items()
                ]
            }

    def lapse_due(self):
        """Give back what every session that went quiet for its ttl held; answers how many lapsed."""
        now = time.monotonic()
        lapsed = 0
        with self.lock:
            for filed in self.sessions.values():
                silent = now - filed["renewed"]
                if filed["lapsed"] is None and silent >= filed["ttl_s"]:
                    filed["lapsed"] = self._give_back(filed, silent)
                    lapsed += 1
        return lapsed

    def _give_back(self, filed, silent):
        stuck = set(self.faults["stuck"])
        creatures, kept_creatures = [], {}
        for key in sorted(filed["keys"]):
            self.revoked.add(key)  # a spawn still on its way lands nothing now
            for ref, creature in list(self.creatures.items()):
                if creature["key"] != key:
                    continue
                if self._stuck(creature, stuck):
                    kept_creatures[ref] = f"the {creature['kind']} is in combat"
                    continue
                del self.creatures[ref]
                creatures.append(ref)
        spawners, kept_spawners = {}, {}
        for name, held in sorted(filed["spawners"].items()):
            current = self.spawners.get(name)
            if current == held["applied"] and held["baseline"] is not None:
                self.spawners[name] = held["baseline"]
                spawners[name] = held["baseline"]
            elif current == held["baseline"]:
                spawners[name] = held["baseline"]  # already back
            else:
                kept_spawners[name] = f"the rate is {current!r}, not the {held['applied']!r} set under the session"
        filed["keys"], filed["spawners"] = set(), {}
        return {
            "at": _now(),
            "ttl_s": filed["ttl_s"],
            "silent_s": round(silent, 3),
            "given_back": {"creatures": creatures, "spawners": spawners},
            "kept": {"creatures": kept_creatures, "spawners": kept_spawners},
        }

    def get_faults(self):
        with self.lock:
            return {**self.faults, "stuck": list(self.faults["stuck"])}

    def set_faults(self, **changes):
        with self.lock:
            self.faults.update(changes)
        return self.get_faults()


# -- routes ------------------------------------------------------------------------------


def route_health(world, request):
    request.no_body()
    return 200, world.health()


def route_spawn(world, request):
    body = request.json_object()
    _only(body, ("key", "creature", "count", "at", "session"))
    key = _text(body, "key")
    creature = _text(body, "creature")
    if "count" not in body:
        raise BadRequest("count is required", field="count")
    count = body["count"]
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise BadRequest(f"count must be a whole number from 1 to {MAX_COUNT}", field="count")
    at = _text(body, "at")
    session = _text(body, "session") if "session" in body else None
    created, answer = world.spawn(key, creature, count, at, session=session)
    return (201 if created else 200), answer


def route_despawn(world, request):
    body = request.json_object()
    _only(body, ("refs",))
    return 200, world.despawn(_refs(body))


def route_revoke(world, request, key):
    request.no_body()
    if not key.strip() or len(key) > MAX_TEXT:
        raise BadRequest(f"a key is a non-empty string of at most {MAX_TEXT} characters", field="key")
    return 200, world.revoke(key)


def route_creatures(world, request):
    request.no_body()
    query = request.query(allowed=("key",))
    key = None
    if "key" in query:
        key = query["key"]
        if not key.strip():
            raise BadRequest("key must be a non-empty string", field="key")
    return 200, {"creatures": world.list_creatures(key)}


def route_lookup(world, request):
    body = request.json_object()
    _only(body, ("refs",))
    return 200, world.lookup(_refs(body))


def route_spawners(world, request):
    request.no_body()
    return 200, {"spawners": world.list_spawners()}


def route_get_spawner(world, request, name):
    request.no_body()
    return 200, world.spawner(name)


def route_put_spawner(world, request, name):
    body = request.json_object()
    _only(body, ("rate", "expected", "session"))
    rate = _rate(body, "rate")
    expected = _rate(body, "expected", required=False)
    session = _text(body, "session") if "session" in body else None
    return 200, world.set_rate(name, rate, expected=expected, session=session)


def route_keepalive(world, request):
    body = request.json_object()
    _only(body, ("session", "ttl_s"))
    session = _text(body, "session")
    ttl_s = body.get("ttl_s")
    if not _is_number(ttl_s) or not 0 < ttl_s <= MAX_TTL_S:
        raise BadRequest(f"ttl_s must be a number of seconds above 0 and at most {MAX_TTL_S}", field="ttl_s")
    return 200, world.keepalive(session, ttl_s)


def route_switch(world, request):
    request.no_body()
    return 200, world.switch()


def route_get_faults(world, request):
    request.no_body()
    return 200, world.get_faults()


def route_post_faults(world, request):
    body = request.json_object()
    _only(body, ("latency_ms", "error_rate", "down", "stuck"))
    changes = {}
    if "latency_ms" in body:
        value = body["latency_ms"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LATENCY_MS:
            raise BadRequest(
                f"latency_ms must be a whole number from 0 to {MAX_LATENCY_MS}",
                field="latency_ms",
            )
        changes["latency_ms"] = value
    if "error_rate" in body:
        value = body["error_rate"]
        if not _is_number(value) or not 0 <= value <= 1:
            raise BadRequest("error_rate must be a number from 0 to 1", field="error_rate")
        changes["error_rate"] = float(value)
    if "down" in body:
        value = body["down"]
        if value is not False and value not in ("refuse", "503"):
            raise BadRequest('down must be false, "refuse" or "503"', field="down")
        changes["down"] = value
    if "stuck" in body:
        value = body["stuck"]
        if (
            not isinstance(value, list)
            or len(value) > MAX_STUCK
            or not all(isinstance(v, str) and v.strip() and len(v) <= MAX_TEXT for v in value)
        ):
            raise BadRequest(
                f"stuck must be a list of at most {MAX_STUCK} creature refs or kinds (non-empty strings)",
                field="stuck",
            )
        changes["stuck"] = list(dict.fromkeys(value))
    return 200, world.set_faults(**changes)


def route_delete_faults(world, request):
    request.no_body()
    return 200, world.set_faults(latency_ms=0, error_rate=0.0, down=False, stuck=[])


def route_drift(world, request):
    body = request.json_object()
    _only(body, ("spawner", "rate"))
    name = _text(body, "spawner")
    if not SPAWNER_NAME.match(name):
        raise BadRequest("spawner must be letters, digits, '.', '_' or '-' (at most 100)", field="spawner")
    rate = _rate(body, "rate")
    return 200, world.set_rate(name, rate, create=True)


def route_save(world, request):
    request.no_body()
    return 200, world.save()


def route_restart(world, request):
    body = request.json_object(optional=True)
    _only(body, ("mode",))
    mode = body.get("mode", "rollback")
    if mode not in RESTART_MODES:
        raise BadRequest('mode must be "rollback" or "wipe"', field="mode")
    return 200, world.restart(mode)


# (method, path pattern, handler, harness route?)
ROUTES = [
    ("GET", r"/health", route_health, False),
    ("POST", r"/spawn", route_spawn, False),
    ("POST", r"/despawn", route_despawn, False),
    ("POST", r"/spawns/(?P<key>[^/]+)/revoke", route_revoke, False),
    ("GET", r"/creatures", route_creatures, False),
    ("POST", r"/creatures/lookup", route_lookup, False),
    ("GET", r"/spawners", route_spawners, False),
    ("GET", r"/spawners/(?P<name>[^/]+)", route_get_spawner, False),
    ("PUT", r"/spawners/(?P<name>[^/]+)", route_put_spawner, False),
    ("POST", r"/keepalive", route_keepalive, False),
    ("GET", r"/switch", route_switch, True),
    ("GET", r"/faults", route_get_faults, True),
    ("POST", r"/faults", route_post_faults, True),
    ("DELETE", r"/faults", route_delete_faults, True),
    ("POST", r"/drift", route_drift, True),
    ("POST", r"/save", route_save, True),
    ("POST", r"/restart", route_restart, True),
]
_COMPILED = [(m, re.compile(p + r"/?\Z"), h, harness) for m, p, h, harness in ROUTES]


def resolve(method, path):
    """``(handler, kwargs, harness)`` for a request, or raise 404/405."""
    allowed = []
    for route_method, pattern, handler, harness in _COMPILED:
        match = pattern.match(path)
        if match:
            if route_method == method:
                kwargs = {k: unquote(v) for k, v in match.groupdict().items()}
                return handler, kwargs, harness
            allowed.append(route_method)
    if allowed:
        raise BadRequest(
            f"{method} is not allowed on {path}; use {', '.join(sorted(set(allowed)))}",
            status=405,
        )
    raise BadRequest(f"no route {path}", status=404)


# -- HTTP --------------------------------------------------------------------------------


class Request:
    """The parts of an HTTP request a route reads, each checked as it is read."""

    def __init__(self, handler, query_string):
        self._handler = handler
        self._query_string = query_string
        self._body = None
        self._read = False

    def raw_body(self):
        if not self._read:
            self._read = True
            self._body = self._handler.read_body()
        return self._body

    def no_body(self):
        self.raw_body()  # read (and drop) whatever came

    def drain(self):
        """Read whatever body is left unread before answering.

        Closing a socket with unread input makes the kernel reset the connection, and
        the client would then lose the answer (a 503, a 400) that was sent before it.
        """
        if self._read:
            return
        self._read = True
        try:
            length = int(self._handler.headers.get("Content-Length") or 0)
        except ValueError:
            return
        left = min(max(length, 0), MAX_BODY_BYTES)
        try:
            while left > 0:
                chunk = self._handler.rfile.read(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def json_object(self, optional=False):
        raw = self.raw_body()
        if not raw.strip():
            if optional:
                return {}
            raise BadRequest("the body must be a JSON object")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8") from None
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from None
        return _require_object(value)

    def query(self, allowed):
        try:
            parsed = parse_qs(self._query_string, keep_blank_values=True, strict_parsing=False)
        except ValueError as exc:
            raise BadRequest(f"the query string cannot be read: {exc}") from None
        unknown = sorted(set(parsed) - set(allowed))
        if unknown:
            raise BadRequest(f"unknown query parameter {unknown[0]!r}", field=unknown[0])
        out = {}
        for name, values in parsed.items():
            if len(values) != 1:
                raise BadRequest(f"{name} may be given once", field=name)
            out[name] = values[0]
        return out


def _reject_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


class ShardHandler(BaseHTTPRequestHandler):
    server_version = "SandboxShard/1.0"
    protocol_version = "HTTP/1.0"  # one request per connection: simple, and enough here
    timeout = 10  # seconds a client may take to send its request

    @property
    def world(self):
        return self.server.world

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def read_body(self):
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            return b""
        try:
            length = int(raw_length)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length < 0:
            raise BadRequest("Content-Length is negative")
        if length > MAX_BODY_BYTES:
            raise BadRequest(f"the body may be at most {MAX_BODY_BYTES} bytes", status=413)
        try:
            data = self.rfile.read(length)
        except OSError:
            data = b""
        if len(data) != length:
            raise BadRequest(f"the body ended after {len(data)} of {length} bytes")
        return data

    def dispatch(self):
        started = time.monotonic()
        parts = urlsplit(self.path)
        request = Request(self, parts.query)
        latency_ms = 0
        try:
            handler, kwargs, harness = resolve(self.command, parts.path)
            if not harness:
                faults = self.world.get_faults()
                latency_ms = faults["latency_ms"]
                if faults["down"] == "refuse":
                    self.reset_connection()
                    return
                if faults["down"] == "503":
                    raise BadRequest("the shard is down", status=503)
                if faults["error_rate"] and random.random() < faults["error_rate"]:
                    raise BadRequest("the shard failed (injected error)", status=503)
            status, body = handler(self.world, request, **kwargs)
        except BadRequest as exc:
            status, body = exc.status, exc.body
        except Exception as exc:  # no input may take the server down
            traceback.print_exc(file=sys.stderr)
            status, body = 500, {"error": f"internal error: {type(exc).__name__}: {exc}"}
        request.drain()
        # A slow shard is slow to answer anything, success or not; the work is done.
        delay = latency_ms / 1000 - (time.monotonic() - started)
        if delay > 0:
            time.sleep(delay)
        self.answer(status, body)

    def reset_connection(self):
        """Drop the connection with a reset and no answer, as a dead process would."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass

    def answer(self, status, body):
        data = json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Boot-Id", self.world.boot_id)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            pass  # the client left (it timed out, or hung up): nothing to answer to

    def send_error(self, code, message=None, explain=None):
        """Errors the HTTP layer raises itself (a garbled request line, ...), as JSON."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # a garbled request line: answer in full
            self.request_version = "HTTP/1.0"
        text = message or self.responses.get(code, ("error",))[0]
        if code == 501:
            code, text = 405, f"method {self.command} is not supported"
        self.answer(code, {"error": text})

    def log_message(self, format, *args):
        sys.stderr.write(f"[shard] {self.address_string()} {format % args}\n")


class ShardServer(ThreadingHTTPServer):
    daemon_threads = True  # a request held by a latency fault never delays a stop
    allow_reuse_address = True
    # Connections the system holds until the server accepts them. A sweep opens one per
    # call, 8 at once per sweeper; past the standard library's 5 the system drops a
    # connection's first packet and the client sends it again a second later.
    request_queue_size = 128

    def __init__(self, address, world=None):
        self.world = world or World()
        super().__init__(address, ShardHandler)

    @property
    def url(self):
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def _saver(world, every_s, stop):
    while not stop.wait(every_s):
        world.save()


def _switch(world, stop):
    """The dead-man's switch: runs whether or not anybody talks to the shard."""
    while not stop.wait(SWITCH_EVERY_S):
        world.lapse_due()


def serve(host=DEFAULT_HOST, port=DEFAULT_PORT, save_every=DEFAULT_SAVE_EVERY_S, out=None):
    """Run a shard until SIGTERM or SIGINT; answers the process exit status."""
    out = out or sys.stdout
    server = ShardServer((host, port))
    stop = threading.Event()
    if save_every > 0:
        threading.Thread(target=_saver, args=(server.world, save_every, stop), name="shard-saver", daemon=True).start()
    threading.Thread(target=_switch, args=(server.world, stop), name="shard-switch", daemon=True).start()

    def on_signal(signum, frame):
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    if host not in ("127.0.0.1", "localhost"):
        print(
            f"warning: the sandbox shard has no authentication and listens on {host}",
            file=sys.stderr,
        )
    saving = f"every {save_every:g} s" if save_every > 0 else "only on POST /save"
    _say(
        out,
        f"sandbox shard listening on {server.url} boot_id={server.world.boot_id} (saves {saving})",
    )
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        stop.set()
        server.server_close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    _say(out, "sandbox shard stopped")
    return 0


def _say(out, line):
    out.write(line + "\n")
    out.flush()


def add_arguments(parser):
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (loopback)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on; 0 picks a free one")
    parser.add_argument(
        "--save-every",
        type=float,
        default=DEFAULT_SAVE_EVERY_S,
        metavar="SECONDS",
        help="save the world this often (0: only on POST /save)",
    )


def check_arguments(port, save_every):
    """The error message for bad options, or None."""
    if not 0 <= port <= 65535:
        return f"--port must be from 0 to 65535, not {port}"
    if not math.isfinite(save_every) or save_every < 0:
        return f"--save-every must be 0 or more seconds, not {save_every}"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m eventsite.sandbox.shard", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    problem = check_arguments(args.port, args.save_every)
    if problem:
        parser.error(problem)
    try:
        return serve(args.host, args.port, args.save_every)
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
