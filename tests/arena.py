"""Real OpenArena servers for tests: Debian's ``openarena-server`` on 127.0.0.1.

Use the fixtures by importing them into a test module::

    from tests.arena import arena_fleet  # noqa: F401  (a pytest fixture)

    def test_something(arena_fleet):          # two running `ArenaServer`s, north and south
        with arena_fleet.settings(): ...      # ARENA_SERVERS pointed at both

Each server gets a free UDP port, a home directory of its own, a low frame rate
(``sv_fps 5``) and room for a few bots. ``arena_fleet`` is shared by the tests of a module
(starting a server takes a few seconds): a test that kills or freezes one starts it again.
The server answers at most 10 rcon requests at once, then one a second, per sender, so a
test looks through the module's own client (`eventsite.arena.rcon`), which keeps to that.
"""

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.test import override_settings

from eventsite.arena import rcon
from tests.servers import ServerProcess, free_udp_port

BINARY = Path(os.environ.get("ARENA_SERVER_BINARY", "/usr/games/openarena-server"))
START_TIMEOUT_S = 60
PASSWORD = "kit-secret"
TIMEOUT_MS = 1500  # ARENA_TIMEOUT_MS in tests: a frozen server is silent within 1.5 s


def missing_reason():
    if not BINARY.exists():
        return f"OpenArena is not installed ({BINARY} is missing): apt-get install openarena-server"
    return None


class ArenaServer(ServerProcess):
    """One dedicated server: start, kill (``kill -9``), pause (SIGSTOP), and rcon to it."""

    def __init__(self, root, name=""):
        self.root = Path(root)
        self.name = name
        self.port = free_udp_port()
        self.process = None
        self.starts = 0

    def command(self):
        return [
            str(BINARY),
            "+set", "dedicated", "1",
            "+set", "net_ip", "127.0.0.1",
            "+set", "net_port", str(self.port),
            "+set", "net_enabled", "1",
            "+set", "com_homepath", str(self.root / "home"),
            "+set", "fs_homepath", str(self.root / "home"),
            "+set", "rconpassword", PASSWORD,
            "+set", "sv_fps", "5",
            "+set", "sv_maxclients", "24",
            "+set", "bot_enable", "1",
            "+set", "sv_master1", "",
            "+set", "g_gametype", "0",
            "+map", "oa_dm1",
        ]  # fmt: skip

    def start(self):
        assert self.process is None or self.process.poll() is not None, "already running"
        log = self.root / f"stdout.{self.starts}"
        self.starts += 1
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if "AAS initialized" in log.read_text(errors="replace"):
                time.sleep(0.3)
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"the OpenArena server exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise RuntimeError(f"the OpenArena server did not load its map within {START_TIMEOUT_S} s:\n{self.log()}")

    # running, stop, kill (bots and cvars set over rcon are gone with the process), pause and
    # resume: `tests.servers.ServerProcess`.
    def restart(self):
        self.kill()
        return self.start()

    @contextlib.contextmanager
    def down(self):
        """A silent outage: the server frozen (SIGSTOP), requests unanswered, then woken.
        What was sent meanwhile waits in the socket and runs when it wakes."""
        self.pause()
        try:
            yield
        finally:
            self.resume()
            time.sleep(0.5)

    @contextlib.contextmanager
    def refused(self):
        """An outage that refuses: the server stopped, started again afterwards."""
        self.kill()
        try:
            yield
        finally:
            self.start()

    # -- looking ---------------------------------------------------------------------------
    def server(self):
        return rcon.Server(self.name, "127.0.0.1", self.port)

    def rcon(self, text, tries=4):
        """One command, asked again after a pause when the answer does not come: a server
        just woken runs what was sent while it slept, and drops what exceeds its rate."""
        with override_settings(ARENA_RCON_PASSWORD=PASSWORD, ARENA_TIMEOUT_MS=2000):
            for _ in range(tries):
                reply = rcon.command(self.server(), text)
                if reply.ok or not reply.unavailable:
                    break
                time.sleep(2)
        assert reply.ok, reply.error
        return reply.text

    def bots(self):
        found = rcon.players(self.rcon("status"))
        assert found is not None
        return sorted(name for name, address in found if address == "bot")

    def cvar(self, name):
        return rcon.cvar_value(self.rcon(name), name)

    def address(self):
        return f"127.0.0.1:{self.port}"

    def log(self):
        parts = []
        for path in sorted(self.root.glob("stdout.*")):
            parts.append(path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)


class ArenaFleet(dict):
    """Servers by name, and the settings that point the module at them."""

    def setting(self):
        return ",".join(f"{name}={server.address()}" for name, server in self.items())

    def settings(self, **more):
        return override_settings(
            ARENA_SERVERS=self.setting(), ARENA_RCON_PASSWORD=PASSWORD, ARENA_TIMEOUT_MS=TIMEOUT_MS, **more
        )

    def heal(self):
        """Every server running and awake, without bots: as a test found it."""
        for server in self.values():
            if server.running():
                server.resume()
            else:
                server.start()
        for server in self.values():
            for bot in server.bots():
                server.rcon(f"kick {bot}")


@contextlib.contextmanager
def running_fleet(*names):
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    fleet = ArenaFleet()
    roots = []
    try:
        for name in names:
            root = Path(tempfile.mkdtemp(prefix=f"arena-{name or 'one'}-"))
            roots.append(root)
            fleet[name] = ArenaServer(root, name=name)
        for server in fleet.values():
            server.start()
        yield fleet
    finally:
        for server in fleet.values():
            server.kill()
            print(f"-- the OpenArena server {server.name!r} said:\n{server.log()[-3000:]}")
        rcon.boot_watch.forget()
        rcon.turns.forget()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def arena_fleet():
    """Two running OpenArena servers, ``north`` and ``south`` (an `ArenaFleet`), shared by the
    tests of one test module; each test gets them running, awake and without bots."""
    with running_fleet("north", "south") as fleet:
        yield fleet


@pytest.fixture
def arena(arena_fleet):
    """The shared fleet, healed before the test (see `ArenaFleet.heal`)."""
    arena_fleet.heal()
    return arena_fleet
