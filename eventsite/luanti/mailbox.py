"""The channel to a Luanti server: a file mailbox in its world directory.

Luanti has no remote console, and a mod with mod security on may write only inside its
world, so the module and the mod (``mod/init.lua``) talk through files there::

    <world>/eventsite/inbox/<id>.json    a request: written to a dot-file, then renamed
    <world>/eventsite/outbox/<id>.json   its answer, written atomically by the mod
    <world>/eventsite/heartbeat.json     rewritten by the mod every second

Nothing else is touched: no socket, no other directory. Each request carries a deadline
(the mod drops it once past) and a key (the mod remembers a spawn's answer by it, so a
request sent again is answered again, not acted on twice). The mod takes a request by
removing its file; a call that got no answer in time removes the file itself if it can,
and then the request provably never landed; if the mod had taken it, it may have landed,
and sending it again under its key is safe.

A heartbeat older than ``LUANTI_HEARTBEAT_STALE_S`` (or none: the mod removes it when the
server shuts down) means the server is not running: the call answers ``unavailable`` at
once, writing nothing. Every answer carries the mod's boot id (made at load: Luanti has
none), and a new one is reported to the engine once (`BootWatch`).

What the mod writes through ``minetest.write_json`` comes back with every number a float
(``72.0`` for ``72``) and every empty table as ``null``: `normalize` undoes both.
May import: `cleanup.registry` and `worlds`.
"""

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from cleanup import registry

from .worlds import World

logger = logging.getLogger(__name__)

MODULE = "luanti"
MAILBOX = "eventsite"  # the directory the mod keeps in its world
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_STALE_S = 5.0
# The mod counts whole seconds (os.time()): it may answer up to a second after the deadline.
GRACE_S = 1.5
POLL_S = 0.02
ORPHAN_AGE_S = 120  # answers nobody waited for any more are removed after this
LIST_FIELDS = ("creatures", "present", "absent", "unknown", "removed")


def timeout_ms() -> float:
    value = getattr(settings, "LUANTI_TIMEOUT_MS", DEFAULT_TIMEOUT_MS)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return DEFAULT_TIMEOUT_MS
    return value


def stale_s() -> float:
    value = getattr(settings, "LUANTI_HEARTBEAT_STALE_S", DEFAULT_STALE_S)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return DEFAULT_STALE_S
    return float(value)


@dataclass(frozen=True)
class Reply:
    """What the mod answered (``body``), or why there is no answer (``error``)."""

    body: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    retry: bool = True
    unavailable: bool = False

    @property
    def ok(self) -> bool:
        return not self.error

    def failure(self) -> dict[str, Any]:
        """This reply as a failure envelope (call it only when ``ok`` is false)."""
        envelope: dict[str, Any] = {"ok": False, "error": self.error, "retry": self.retry}
        if self.unavailable:
            envelope["unavailable"] = True
        return envelope


def normalize(value: Any) -> Any:
    """Whole floats back to ints, recursively (``72.0`` -> ``72``); ``null`` lists to ``[]``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        body = {k: normalize(v) for k, v in value.items()}
        for name in LIST_FIELDS:
            if name in body and body[name] is None:
                body[name] = []
        return body
    return value


class BootWatch:
    """The boot ids seen per world, and a new one reported to the engine once."""

    KEEP = 16  # ids remembered per world: an answer from before a restart is no news

    def __init__(self, module: str) -> None:
        self.module = module
        self._seen: dict[tuple[str, str], list[str]] = {}
        self._lock = threading.Lock()

    def observe(self, world: World, boot_id: object) -> bool:
        if not isinstance(boot_id, str) or not boot_id:
            return False
        with self._lock:
            seen = self._seen.setdefault((world.name, str(world.path)), [])
            if boot_id in seen:
                return False
            seen.append(boot_id)
            del seen[: -self.KEEP]
            restarted = len(seen) > 1
        if restarted:
            logger.warning("%s restarted (boot id %s)", world.label, boot_id)
            try:
                registry.backend_restarted(self.module, world.name)
            except Exception:
                logger.exception("could not report the restart of %s", world.label)
        return restarted

    def forget(self) -> None:
        with self._lock:
            self._seen.clear()


boot_watch = BootWatch(MODULE)
_swept: dict[str, float] = {}


def heartbeat(world: World) -> tuple[float | None, dict[str, Any]]:
    """``(age in seconds, what the mod wrote)``; the age is None when there is no heartbeat."""
    path = world.path / MAILBOX / "heartbeat.json"
    try:
        age = time.time() - path.stat().st_mtime
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, {}
    return age, normalize(body) if isinstance(body, dict) else {}


def _not_running(world: World) -> Reply | None:
    """Why the server is not running now, as an unavailable reply; None when it is."""
    path = world.path / MAILBOX / "heartbeat.json"
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        if not world.path.is_dir():
            return Reply(error=f"{world.label} does not exist", unavailable=True)
        return Reply(
            error=f"{world.label} is not running with the eventsite mod: it has no heartbeat ({path})",
            unavailable=True,
        )
    except OSError as exc:
        return Reply(error=f"{world.label}: cannot read its heartbeat: {exc}", unavailable=True)
    if age > stale_s():
        return Reply(
            error=f"{world.label} is not running: its heartbeat is {age:.0f} s old (the mod touches it every second)",
            unavailable=True,
        )
    return None


def _sweep_orphans(outbox: os.PathLike[str]) -> None:
    """Remove answers to requests nobody waits for any more (once a minute per outbox)."""
    now = time.time()
    if now - _swept.get(str(outbox), 0) < 60:
        return
    _swept[str(outbox)] = now
    try:
        with os.scandir(outbox) as entries:
            for entry in entries:
                try:
                    if now - entry.stat().st_mtime > ORPHAN_AGE_S:
                        os.unlink(entry.path)
                except OSError:
                    pass
    except OSError:
        pass


def call(world: World, op: str, *, key: str = "", timeout: float | None = None, **args: Any) -> Reply:
    """Send one request to the mod of ``world`` and wait for its answer, at most ``timeout`` ms."""
    down = _not_running(world)
    if down is not None:
        return down
    box = world.path / MAILBOX
    inbox, outbox = box / "inbox", box / "outbox"
    limit_s = (timeout if timeout is not None else timeout_ms()) / 1000
    rid = f"{time.time_ns():020d}-{uuid.uuid4().hex[:16]}"  # by time: the mod takes them in order
    request = {"op": op, "key": key, "deadline": time.time() + limit_s, **args}
    temporary, posted = inbox / f".{rid}.tmp", inbox / f"{rid}.json"
    try:
        temporary.write_text(json.dumps(request))
        os.replace(temporary, posted)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        return Reply(error=f"{world.label}: cannot post a request in {inbox}: {exc}", unavailable=True)
    _sweep_orphans(outbox)
    answer = outbox / f"{rid}.json"
    end = time.monotonic() + limit_s + GRACE_S
    while True:
        try:
            text = answer.read_text()
        except FileNotFoundError:
            text = None
        except OSError as exc:
            return Reply(error=f"{world.label}: cannot read the answer {answer}: {exc}")
        if text is not None:
            answer.unlink(missing_ok=True)
            return _read(world, op, text)
        if time.monotonic() >= end:
            break
        time.sleep(POLL_S)
    try:
        posted.unlink()
    except FileNotFoundError:
        return Reply(
            error=f"{world.label} took the request {op} but did not answer within {limit_s * 1000:g} ms; "
            "it may have landed, and is safe to send again under its key",
            unavailable=True,
        )
    except OSError:
        pass
    return Reply(
        error=f"{world.label} did not take the request {op} within {limit_s * 1000:g} ms: withdrawn, it never landed",
        unavailable=True,
    )


def _read(world: World, op: str, text: str) -> Reply:
    try:
        body = json.loads(text)
    except ValueError:
        return Reply(error=f"{world.label} answered {op} with something that is not JSON")
    if not isinstance(body, dict):
        return Reply(error=f"{world.label} answered {op} with no JSON object")
    body = normalize(body)
    boot_watch.observe(world, body.get("boot_id"))
    return Reply(body=body)
