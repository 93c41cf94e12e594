"""``DEMO_BACKEND=luanti make demo``: the demo's story on a real Luanti server.

Called by ``bin/demo`` with the demo itself (its ``start``, ``stop_child``, ``say``,
``wait_for``, ``until``, ``on_real_servers``, ``stop_all`` and ``WEB``), the
directory of its logs and the demo user's password. It makes a fresh world under
``var/demo-luanti/`` with the mod installed, starts Debian's ``minetestserver`` on
127.0.0.1 (UDP ``DEMO_LUANTI_PORT``, 30000), the cluster and the web server, then tells
the story: a wolf night whose wolves and ``time_speed`` are given back; a crash that
brings given-back wolves back, found through the mod's boot id with no run active and
given back again; a server stopped while its rows are given back, which spends no
attempt and finishes once the server returns.
May import: the module's own parts, `cleanup` (the demo drives the engine as a person would).
"""

import os
import shutil
import signal
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

from django.conf import settings

from . import install, mailbox
from .worlds import World

BINARY = Path("/usr/games/minetestserver")
# A server of this machine alone (the tests' servers too): on 127.0.0.1, announced nowhere,
# mod security on, a map of air (quick to make), saved when the server stops cleanly.
CONFIG = """\
bind_address = 127.0.0.1
ipv6_server = false
enable_ipv6 = false
server_announce = false
mg_name = singlenode
secure.enable_security = true
server_map_save_interval = 3600
"""


def server_command(binary: Path, world: Path, port: int, config: Path, logfile: Path) -> list[str]:
    """The command that runs a Luanti server (``binary``) on ``world``, with its own config and
    log file (the demo's server and the tests')."""
    return [
        str(binary),
        "--world",
        str(world),
        "--gameid",
        "minetest",
        "--port",
        str(port),
        "--config",
        str(config),
        "--logfile",
        str(logfile),
    ]


class Server:
    """The demo's one Luanti server: started through the demo, so Ctrl-C stops it too."""

    def __init__(self, demo: ModuleType, root: Path, logs: Path) -> None:
        self.demo, self.root, self.logs = demo, root, logs
        self.world = World("", root / "world")
        self.port = int(os.environ.get("DEMO_LUANTI_PORT", "30000"))
        self.process: subprocess.Popen[bytes] | None = None

    def make_world(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.world.path.mkdir(parents=True)
        (self.world.path / "world.mt").write_text("gameid = minetest\nbackend = sqlite3\n")
        install.install(self.world.path)
        (self.root / "minetest.conf").write_text(CONFIG)

    def start(self) -> None:
        before = mailbox.heartbeat(self.world)[1].get("boot_id")
        argv = server_command(BINARY, self.world.path, self.port, self.root / "minetest.conf", self.root / "debug.txt")
        self.process = self.demo.start("luanti", argv, self.logs)

        def beating() -> bool:
            age, body = mailbox.heartbeat(self.world)
            return age is not None and age < 1.5 and body.get("boot_id") not in (None, before)

        self.demo.wait_for("the Luanti server", beating)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.demo.stop_child(self.process, sig)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        reply = mailbox.call(self.world, op, **args)
        return reply.body if reply.ok else {"ok": False, "error": reply.error}

    def present(self, refs: list[str]) -> int:
        return len(self.call("lookup", refs=refs).get("present") or [])

    def time_speed(self) -> Any:
        return self.call("setting", setting="time_speed").get("value")


def main(demo: ModuleType, logs: Path, password: str) -> None:
    if not BINARY.exists():
        demo.say(f"DEMO_BACKEND=luanti needs Debian's Luanti server ({BINARY} is missing):")
        demo.say("    sudo apt-get install minetest-server    (Luanti 5.6 with minetest_game)")
        demo.say("or run the sandbox story: make demo")
        demo.stop_all()
        return
    server = Server(demo, Path(settings.VAR_DIR) / "demo-luanti", logs)
    server.make_world()
    # The cluster and the web server read these when they start; this process too.
    os.environ["LUANTI_WORLDS"] = str(server.world.path)
    settings.LUANTI_WORLDS = str(server.world.path)
    server.start()
    where = f"Luanti server on 127.0.0.1 UDP {server.port}, world {server.world.path}"
    demo.on_real_servers(logs, password, where, lambda: tell_story(demo, server))


def tell_story(demo: ModuleType, server: Server) -> None:
    from cleanup.models import Resource, Run
    from cleanup.runner import cancel_run, start_run

    def spawn(count: int, at: list[int]) -> dict[str, Any]:
        return {"action": "luanti.spawn", "params": {"entity": "wolf", "count": count, "at": at}}

    def refs(run: Run) -> list[str]:
        return list(Resource.objects.filter(run=run, kind="creature").values_list("ref", flat=True))

    def clean(run: Run) -> bool:
        return Run.objects.filter(pk=run.pk, cleanup_status="complete").exists()

    def made(run: Run, count: int) -> bool:
        return len(refs(run)) == count

    lease = {"action": "core.lease", "params": {"lease": "luanti.time_speed", "target": "default", "value": 150}}
    demo.say(f"1/3 a wolf night: 6 wolves and time_speed 150 (now {server.time_speed()}) for 10 s")
    night = start_run(
        "Wolf night", [spawn(6, [0, 8, 0]), lease, {"action": "core.wait", "params": {"seconds": 10}}], actor="demo"
    )
    demo.until(lambda: made(night, 6), 30)
    demo.say(f"   in the world: {server.present(refs(night))} wolves, time_speed {server.time_speed()}")
    demo.until(lambda: clean(night), 60)
    demo.say(f"   run {night.pk} ended: {server.present(refs(night))} wolves left, time_speed {server.time_speed()}")

    demo.say("2/3 a crash: the map was saved with wolves that are then given back, and the server is killed")
    pack = start_run(
        "Wolf pack (outlives a crash)",
        [spawn(4, [40, 8, 0]), {"action": "core.wait", "params": {"seconds": 3600}}],
        actor="demo",
    )
    demo.until(lambda: made(pack, 4), 30)
    server.stop()  # saves the map, wolves in it
    server.start()
    cancel_run(pack.pk, actor="demo")
    demo.until(lambda: clean(pack), 60)
    demo.say(f"   run {pack.pk} given back: {server.present(refs(pack))} wolves; now kill -9 and start again")
    server.stop(signal.SIGKILL)
    server.start()
    demo.say(
        f"   the map brought back {server.present(refs(pack))} wolves; the mod's new boot id tells of the "
        "restart (the engine also asks for it every EVENT_BACKEND_WATCH_S, with no run active)"
    )
    demo.until(lambda: Resource.objects.filter(run=pack, resurrected_from__isnull=False).exists(), 90)
    demo.until(lambda: clean(pack) and server.present(refs(pack)) == 0, 60)
    demo.say(f"   found through the new boot id and given back again: {server.present(refs(pack))} wolves")

    demo.say("3/3 the server stops while a cancelled run is given back")
    raid = start_run(
        "Raid (its server stops)",
        [spawn(3, [80, 8, 0]), {"action": "core.wait", "params": {"seconds": 3600}}],
        actor="demo",
    )
    demo.until(lambda: made(raid, 3), 30)
    server.stop()
    cancel_run(raid.pk, actor="demo")
    from cleanup import outages

    demo.until(lambda: ("luanti", "") in outages.down_backends(), 30)
    attempts = sorted(set(Resource.objects.filter(run=raid, kind="creature").values_list("revert_attempts", flat=True)))
    demo.say(f"   the module is down; the raid's rows wait, attempts spent: {attempts}")
    server.start()
    demo.until(lambda: clean(raid), 90)
    demo.say(
        f"   the server is back; run {raid.pk}: cleanup {Run.objects.get(pk=raid.pk).cleanup_status}, "
        f"{server.present(refs(raid))} wolves left"
    )
    demo.say(f"the modules' log: {demo.WEB}/admin/cleanup/moduleevent/")
