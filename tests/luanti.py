"""Real Luanti servers for tests: Debian's ``minetestserver`` on 127.0.0.1, a fresh world each.

Use the fixtures by importing them into a test module::

    from tests.luanti import luanti_server  # noqa: F401  (a pytest fixture)

    def test_something(luanti_server):        # a running `LuantiServer`
        with luanti_server.settings(): ...    # LUANTI_WORLDS pointed at its world

Each server gets a free UDP port, a world in a temporary directory with the mod installed
(through `eventsite.luanti.install`, as an operator would), mod security on, and the
``singlenode`` map generator (air everywhere: quick to generate). The map is saved only
when the server stops cleanly (``server_map_save_interval`` is an hour), so a test decides
what a ``kill -9`` loses. Every process is killed when its test ends.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.test import override_settings

from eventsite.luanti import demo as luanti_demo
from eventsite.luanti import install, mailbox
from tests.servers import ServerProcess, free_udp_port

BINARY = Path(os.environ.get("LUANTI_SERVER_BINARY", "/usr/games/minetestserver"))
START_TIMEOUT_S = 30
STALE_S = 2.0  # LUANTI_HEARTBEAT_STALE_S in tests: an outage is seen within two seconds

# The demo's server config, and a bound on forceloaded blocks a test may lower.
CONFIG = luanti_demo.CONFIG + "max_forceloaded_blocks = {max_forceloaded_blocks}\n"


def missing_reason():
    if not BINARY.exists():
        return f"Luanti is not installed ({BINARY} is missing): apt-get install minetest-server"
    return None


class LuantiServer(ServerProcess):
    """One Luanti server on its own world: start, stop, kill, pause, and its mailbox state."""

    stop_timeout = 15.0

    def __init__(self, root, name="", max_forceloaded_blocks=16):
        self.root = Path(root)
        self.name = name
        self.world = self.root / "world"
        self.world.mkdir(parents=True)
        (self.world / "world.mt").write_text(
            "gameid = minetest\nbackend = sqlite3\nplayer_backend = sqlite3\nauth_backend = sqlite3\n"
        )
        install.install(self.world)
        self.config = self.root / "minetest.conf"
        self.config.write_text(CONFIG.format(max_forceloaded_blocks=max_forceloaded_blocks))
        self.port = free_udp_port()
        self.process = None
        self.boot_id = None
        self.boots = []

    # -- the process ---------------------------------------------------------------------
    def start(self):
        assert self.process is None or self.process.poll() is not None, "already running"
        before = self.boot_id
        command = luanti_demo.server_command(BINARY, self.world, self.port, self.config, self.root / "debug.txt")
        with open(self.root / "stdout", "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.boot_id = self.wait_heartbeat(other_than=before)
        self.boots.append(self.boot_id)
        return self

    def wait_heartbeat(self, other_than=None, timeout=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            age, body = mailbox.heartbeat(self.world_ref())
            boot = body.get("boot_id")
            if age is not None and age < 1.5 and boot and boot != other_than:
                return boot
            if self.process.poll() is not None:
                raise RuntimeError(f"the Luanti server exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"the Luanti server's mod never beat within {timeout} s:\n{self.log()}")

    # stop (SIGTERM: it saves the map), kill (what the map had not saved is lost), pause and
    # resume: `tests.servers.ServerProcess`.
    def restart(self, sig=signal.SIGTERM):
        self.stop(sig)
        return self.start()

    @contextlib.contextmanager
    def down(self):
        """An outage that really stops the server: SIGSTOP until the heartbeat is stale,
        SIGCONT after, and back once the mod beats again (the conformance kit's outage)."""
        self.pause()
        try:
            time.sleep(STALE_S + 0.5)
            yield
        finally:
            self.resume()
            self.wait_heartbeat()

    # -- the world -----------------------------------------------------------------------
    def world_ref(self):
        from eventsite.luanti.worlds import World

        return World(self.name, self.world)

    def setting(self):
        """``LUANTI_WORLDS`` for this server alone."""
        return f"{self.name}={self.world}" if self.name else str(self.world)

    def settings(self, **more):
        return override_settings(LUANTI_WORLDS=self.setting(), LUANTI_HEARTBEAT_STALE_S=STALE_S, **more)

    def call(self, op, timeout=8000, **args):
        """A request straight to the mod (the module's channel), for a test to look."""
        reply = mailbox.call(self.world_ref(), op, timeout=timeout, **args)
        assert reply.ok, reply.error
        return reply.body

    def lookup(self, refs, timeout=8000):
        return self.call("lookup", refs=list(refs), timeout=timeout)

    def present(self, refs):
        body = self.lookup(refs)
        assert body["unknown"] == [], body
        return sorted(body["present"])

    def state(self):
        """What the mod recorded (its state file, a Lua table) as text."""
        path = self.world / "eventsite" / "state.lua"
        return path.read_text() if path.exists() else ""

    def log(self):
        parts = []
        for name in ("stdout", "debug.txt"):
            path = self.root / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def heartbeat(self):
        return json.loads((self.world / "eventsite" / "heartbeat.json").read_text())


@contextlib.contextmanager
def running_server(name="", **options):
    """A started server on a fresh world, killed (and its world removed) afterwards."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="luanti-"))
    server = LuantiServer(root, name=name, **options)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        mailbox.boot_watch.forget()
        # Shown by pytest only when the test failed: what the server said before it went.
        print(f"-- the Luanti server's log ({server.world}):\n{server.log()[-4000:]}")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def luanti_server():
    """A running Luanti server with the mod, on a fresh world (a `LuantiServer`)."""
    with running_server() as server:
        yield server
