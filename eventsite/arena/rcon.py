"""A small rcon client for ioquake3 servers (OpenArena), over UDP, and the fleet it talks to.

One request is one datagram, ``"\\xff\\xff\\xff\\xffrcon PASSWORD COMMAND"``; the server
answers with zero or more datagrams, each ``"\\xff\\xff\\xff\\xffprint\\n"`` and a part of the
console output the command printed. There is no end marker: the answer is what arrives
until a short quiet gap. Each request gets a socket of its own, so a late answer to an
earlier request can never be read as this one's.

What the server may do instead of answering, and what it becomes here (`Reply`):

- nothing within the timeout: the server is frozen, gone, behind a firewall, or it dropped
  the request because too many came too fast (it keeps 10 at once, then one a second, per
  sender). All are the same silence, so it is ``unavailable`` and worth a retry;
- an ICMP "port unreachable" (nothing listens on the port): ``unavailable`` too;
- ``Bad rconpassword.`` or ``No rconpassword set on the server.``: terminal, a person
  must fix the setting.

The server's limit is kept here as well: each server's requests from this process wait for
a turn (`Turns`, ``BURST`` at once, then ``RATE`` a second), so that the module's own
requests are not the ones dropped. The engine's ``max_rate`` on the module's actions and
leases spreads the calls of every process of the site on top of it.

Settings are read at each request: ``ARENA_SERVERS``, ``ARENA_RCON_PASSWORD`` and
``ARENA_TIMEOUT_MS``.
May import: `cleanup.registry`, `cleanup.envelopes` and the module's own parts.
"""

import logging
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings

from cleanup import registry
from cleanup.envelopes import Failure

from .servers import BadServers, parse_servers

logger = logging.getLogger(__name__)

MODULE = "arena"
PREFIX = b"\xff\xff\xff\xff"
PRINT = PREFIX + b"print\n"
QUIET_S = 0.15  # the gap that ends a multi-datagram answer
BURST = 8  # under the server's 10 at once
RATE = 1.0  # the server's one a second, per sender
BOOT_CVAR = "eventsite_boot"
CVAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


class ServerError(ValueError):
    """A server the settings do not name, or settings that cannot be read."""


@dataclass(frozen=True)
class Server:
    name: str
    host: str
    port: int

    @property
    def label(self) -> str:
        return f"the server {self.name!r}" if self.name else "the arena server"


def servers() -> dict[str, Server]:
    """The servers of ``ARENA_SERVERS``, read now."""
    try:
        parsed = parse_servers(getattr(settings, "ARENA_SERVERS", ""))
    except BadServers as exc:
        raise ServerError(f"ARENA_SERVERS: {exc}") from None
    return {name: Server(name, host, port) for name, (host, port) in parsed.items()}


def _names(fleet: dict[str, Server]) -> str:
    return ", ".join(repr(n) for n in fleet) or "none (ARENA_SERVERS is empty)"


def server(backend: str) -> Server:
    """The server named ``backend`` (``""``: the only one). Raises `ServerError`."""
    fleet = servers()
    if backend in fleet:
        return fleet[backend]
    if backend == "" and len(fleet) == 1:
        return next(iter(fleet.values()))
    if backend == "":
        raise ServerError(f"name a server: the servers are {_names(fleet)}")
    raise ServerError(f"no server is named {backend!r} (the servers are {_names(fleet)})")


def backend_named(name: object) -> str:
    """The backend a step's ``shard`` param names (or the only server when it names none).
    Raises ``ValueError`` naming the servers there are."""
    fleet = servers()
    if name is None:
        if len(fleet) == 1:
            return next(iter(fleet))
        raise ValueError(f"shard: name a server; the servers are {_names(fleet)}")
    if not isinstance(name, str) or name not in fleet:
        raise ValueError(f"shard: no server is named {name!r}; the servers are {_names(fleet)}")
    return name


def split_target(target: object) -> tuple[str | None, str]:
    """``("north", "g_gravity")`` from ``"north:g_gravity"``; ``(None, "g_gravity")`` without
    a server. Raises ``ValueError`` for a target that is no cvar name."""
    if not isinstance(target, str):
        raise ValueError("target must be SERVER:cvar (or a cvar, with one server)")
    name, sep, cvar = target.rpartition(":")
    if not CVAR.match(cvar):
        raise ValueError(f"target: {cvar!r} is not a cvar name (letters, digits and _, at most 64)")
    return (name if sep else None), cvar


# -- the server's limit, kept from this process ------------------------------------------


class Turns:
    """A token bucket per server: ``BURST`` requests at once, then ``RATE`` a second."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[tuple[str, int], float] = {}

    def wait(self, where: tuple[str, int]) -> float:
        """Wait for this request's turn; answers how long it waited."""
        interval = 1.0 / RATE
        with self._lock:
            now = time.monotonic()
            theoretical = max(self._next.get(where, now), now) + interval
            self._next[where] = theoretical
            delay = theoretical - BURST * interval - now
        if delay > 0:
            time.sleep(delay)
            return delay
        return 0.0

    def forget(self) -> None:
        with self._lock:
            self._next.clear()


turns = Turns()


# -- one request ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """The server's answer to one command: ``text`` when ``ok``, else why there is none."""

    ok: bool
    text: str = ""
    error: str = ""
    unavailable: bool = False
    retry: bool = True

    def failure(self) -> Failure:
        answer: Failure = {"ok": False, "error": self.error, "retry": self.retry}
        if self.unavailable:
            answer["unavailable"] = True
        return answer


def timeout_ms() -> int:
    value = getattr(settings, "ARENA_TIMEOUT_MS", 2000)
    return value if isinstance(value, int) and value > 0 else 2000


def command(target: Server, text: str, *, timeout: int | None = None) -> Reply:
    """Send one rcon command to ``target`` and answer what it printed."""
    if any(c in text for c in '\n\r\x00;"'):
        return Reply(
            ok=False, error=f"refused to send {text!r:.80}: it holds a character rcon cannot carry", retry=False
        )
    password = getattr(settings, "ARENA_RCON_PASSWORD", "")
    if not isinstance(password, str) or not password:
        return Reply(ok=False, error="ARENA_RCON_PASSWORD is not set: the module cannot use rcon", retry=False)
    wait_s = (timeout or timeout_ms()) / 1000
    where = (target.host, target.port)
    turns.wait(where)
    packet = PREFIX + b"rcon " + password.encode() + b" " + text.encode()
    parts: list[bytes] = []
    verb = text.split(" ", 1)[0]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(where)  # an ICMP "port unreachable" then fails the next read
            sock.settimeout(wait_s)
            sock.send(packet)
            while True:
                try:
                    data = sock.recv(65535)
                except TimeoutError:
                    break
                if data.startswith(PRINT):
                    parts.append(data[len(PRINT) :])
                    sock.settimeout(QUIET_S)
    except ConnectionRefusedError:
        return Reply(
            ok=False,
            error=f"{target.label} refused rcon {verb} (nothing listens on {target.host}:{target.port})",
            unavailable=True,
        )
    except OSError as exc:
        return Reply(ok=False, error=f"{target.label} could not be reached for rcon {verb}: {exc}", unavailable=True)
    if not parts:
        return Reply(
            ok=False,
            error=f"{target.label} did not answer rcon {verb} within {int(wait_s * 1000)} ms "
            "(down, frozen, unreachable, or it dropped the request)",
            unavailable=True,
        )
    out = b"".join(parts).decode("utf-8", "replace")
    first = out.strip().splitlines()[0] if out.strip() else ""
    if first in ("Bad rconpassword.", "No rconpassword set on the server."):
        return Reply(ok=False, error=f"{target.label} refused the rcon password: {first}", retry=False)
    return Reply(ok=True, text=out)


# -- what a server's answers mean ----------------------------------------------------------

_VALUE = re.compile(r'^"(?P<name>[^"]+)" is:"(?P<value>.*?)\^7"(?:, the default| default:".*\^7"| latched:.*)*$')
_STATUS = re.compile(r"^\s*\d+\s+-?\d+\s+(?P<ping>\S+)\s+(?P<name>.+?)\s*\^7(?P<address>\S*)\s+\d+\s*$")


def cvar_value(text: str, cvar: str) -> str | None:
    """The value a cvar read printed, or None when the server has no such cvar."""
    for line in text.splitlines():
        match = _VALUE.match(line.strip())
        if match and match["name"].lower() == cvar.lower():
            return match["value"]
    return None


def players(text: str) -> list[tuple[str, str]] | None:
    """``[(name, address)]`` of a ``status`` answer (``"bot"`` for a bot), or None when the
    answer is not a status table (no map is running)."""
    lines = text.splitlines()
    if not any(line.startswith("map:") for line in lines):
        return None
    found = []
    for line in lines:
        match = _STATUS.match(line)
        if match and match["ping"] not in ("ZMBI",):
            found.append((match["name"], match["address"]))
    return found


def serverinfo(text: str) -> dict[str, str]:
    """The ``key value`` lines of a ``serverinfo`` answer."""
    info = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key and value and not line.startswith("Server info"):
            info[key] = value.strip()
    return info


# -- boot ids --------------------------------------------------------------------------------


def boot_id(target: Server) -> Reply:
    """The identity of what the server holds now, as ``Reply.text``.

    The engine has no boot id, so the module makes one: at first contact after the server
    started it sets the server-info cvar ``eventsite_boot`` to a fresh token (a new process
    starts with it empty). The map's name and load time (``g_timestamp``) go with it, so a
    map change, which resets what the map held, is a new identity as well.
    """
    reply = command(target, "serverinfo")
    if not reply.ok:
        return reply
    info = serverinfo(reply.text)
    if "mapname" not in info:
        return Reply(ok=False, error=f"{target.label} runs no map (its server info has no mapname)", unavailable=True)
    token = info.get(BOOT_CVAR, "")
    if not token:
        reply = command(target, f"sets {BOOT_CVAR} {secrets.token_hex(8)}")
        if not reply.ok:
            return reply
        reply = command(target, "serverinfo")  # another process may have set its own first
        if not reply.ok:
            return reply
        info = serverinfo(reply.text)
        token = info.get(BOOT_CVAR, "")
        if not token:
            return Reply(ok=False, error=f"{target.label} did not keep the cvar {BOOT_CVAR}")
    return Reply(ok=True, text=f"{token}/{info['mapname']}/{info.get('g_timestamp', '')}")


@dataclass
class BootWatch:
    """The boot ids seen per server, to report a change once (`registry.backend_restarted`)."""

    seen: dict[tuple[str, str, int], list[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, target: Server, boot: str) -> None:
        key = (target.name, target.host, target.port)
        with self.lock:
            known = self.seen.setdefault(key, [])
            news = bool(known) and boot not in known
            if boot not in known:
                known.append(boot)
                del known[:-4]
        if news:
            try:
                registry.backend_restarted(MODULE, target.name)
            except Exception:
                logger.exception("reporting the restart of %s failed", target.label)

    def forget(self) -> None:
        with self.lock:
            self.seen.clear()


boot_watch = BootWatch()
