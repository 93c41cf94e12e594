"""``DEMO_BACKEND=arena make demo``: the demo's story on two real OpenArena servers.

Called by ``bin/demo`` with the demo itself (its ``start``, ``stop_child``, ``say``,
``wait_for``, ``until``, ``on_real_servers``, ``stop_all`` and ``WEB``), the
directory of its logs and the demo user's password. It starts two of Debian's OpenArena
dedicated servers on 127.0.0.1, ``north`` and ``south`` (UDP ``DEMO_ARENA_PORT``, 27960, and
the next port), the cluster and the web server, then tells the story: a match with bots on
both servers and ``g_gravity`` lowered on north, all given back when it ends; north killed
(``kill -9``) and started again mid-event, its bots and its gravity found gone through the
module's boot id and ended ``orphaned``; north frozen while a cancelled run is given back,
south at once and north, without spending an attempt, once it wakes.
May import: the module's own parts, `cleanup` (the demo drives the engine as a person would).
"""

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from django.conf import settings

from . import rcon

BINARY = Path("/usr/games/openarena-server")


class Server:
    """One of the demo's servers: started through the demo, so Ctrl-C stops it too."""

    def __init__(self, demo: ModuleType, name: str, port: int, root: Path, logs: Path) -> None:
        self.demo, self.name, self.port, self.root, self.logs = demo, name, port, root, logs
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.root / "home").mkdir(parents=True, exist_ok=True)
        argv = [str(BINARY)]
        for cvar, value in (
            ("dedicated", "1"),
            ("net_ip", "127.0.0.1"),
            ("net_port", str(self.port)),
            ("com_homepath", str(self.root / "home")),
            ("fs_homepath", str(self.root / "home")),
            ("rconpassword", os.environ["ARENA_RCON_PASSWORD"]),
            ("sv_fps", "5"),
            ("sv_maxclients", "16"),
            ("bot_enable", "1"),
            ("sv_master1", ""),
        ):
            argv += ["+set", cvar, value]
        argv += ["+map", "oa_dm1"]
        self.process = self.demo.start(f"arena-{self.name}", argv, self.logs)
        self.demo.wait_for(f"the OpenArena server {self.name}", lambda: self.ask("status") is not None)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.demo.stop_child(self.process, sig)

    def signal(self, sig: int) -> None:
        if self.process is not None:
            os.kill(self.process.pid, sig)

    def ask(self, text: str) -> str | None:
        reply = rcon.command(rcon.Server(self.name, "127.0.0.1", self.port), text)
        return reply.text if reply.ok else None

    def bots(self) -> int:
        found = rcon.players(self.ask("status") or "")
        return len([n for n, address in found or [] if address == "bot"])

    def gravity(self) -> str:
        return rcon.cvar_value(self.ask("g_gravity") or "", "g_gravity") or "?"


def main(demo: ModuleType, logs: Path, password: str) -> None:
    if not BINARY.exists():
        demo.say(f"DEMO_BACKEND=arena needs Debian's OpenArena server ({BINARY} is missing):")
        demo.say("    sudo apt-get install openarena-server")
        demo.say("or run the sandbox story: make demo")
        demo.stop_all()
        return
    port = int(os.environ.get("DEMO_ARENA_PORT", "27960"))
    root = Path(settings.VAR_DIR) / "demo-arena"
    servers = {name: Server(demo, name, port + n, root / name, logs) for n, name in enumerate(("north", "south"))}
    # The cluster and the web server read these when they start; this process too.
    os.environ.setdefault("ARENA_RCON_PASSWORD", secrets.token_hex(8))
    os.environ["ARENA_SERVERS"] = ",".join(f"{name}=127.0.0.1:{s.port}" for name, s in servers.items())
    settings.ARENA_SERVERS = os.environ["ARENA_SERVERS"]
    settings.ARENA_RCON_PASSWORD = os.environ["ARENA_RCON_PASSWORD"]
    for server in servers.values():
        server.start()
    where = f"OpenArena servers on 127.0.0.1: {os.environ['ARENA_SERVERS']}"
    demo.on_real_servers(logs, password, where, lambda: tell_story(demo, servers))


def tell_story(demo: ModuleType, servers: dict[str, Server]) -> None:
    from cleanup import outages
    from cleanup.models import Resource, Run
    from cleanup.runner import cancel_run, start_run

    north, south = servers["north"], servers["south"]

    def bots(count: int, shard: str) -> dict[str, Any]:
        return {"action": "arena.bots", "params": {"count": count, "skill": 1, "shard": shard}}

    def gravity(value: int, shard: str) -> dict[str, Any]:
        return {
            "action": "core.lease",
            "params": {"lease": "arena.cvar", "target": f"{shard}:g_gravity", "value": value},
        }

    def wait(seconds: int) -> dict[str, Any]:
        return {"action": "core.wait", "params": {"seconds": seconds}}

    def clean(run: Run) -> bool:
        return Run.objects.filter(pk=run.pk, cleanup_status="complete").exists()

    def made(run: Run, count: int) -> bool:
        return Resource.objects.filter(run=run, kind="bot").count() == count

    def states(run: Run) -> str:
        rows = Resource.objects.filter(run=run).exclude(kind="step").values_list("backend", "kind", "state")
        counts: dict[str, int] = {}
        for backend, kind, state in rows:
            key = f"{backend} {kind} {state}"
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{n} {key}" for key, n in sorted(counts.items()))

    demo.say(f"1/3 a match: 3 bots on north, 2 on south, north's gravity 300 (now {north.gravity()}) for 10 s")
    match = start_run(
        "Low-gravity match", [bots(3, "north"), bots(2, "south"), gravity(300, "north"), wait(10)], actor="demo"
    )
    demo.until(lambda: made(match, 5), 60)
    demo.say(f"   on the servers: north {north.bots()} bots at gravity {north.gravity()}, south {south.bots()} bots")
    demo.until(lambda: clean(match), 90)
    demo.say(
        f"   run {match.pk} ended: north {north.bots()} bots, gravity {north.gravity()}; south {south.bots()} bots"
    )

    demo.say("2/3 north is killed (kill -9) mid-event and started again")
    night = start_run(
        "Night shift", [bots(2, "north"), gravity(250, "north"), bots(1, "south"), wait(3600)], actor="demo"
    )
    demo.until(lambda: made(night, 3), 60)
    north.stop(signal.SIGKILL)
    north.start()
    demo.say("   its bots and its gravity went with the process; the module's boot id (a token it sets")
    demo.say("   at first contact, empty in a new process) tells the engine at its next watch")
    demo.until(lambda: Resource.objects.filter(run=night, state="orphaned").count() == 3, 120)
    demo.say(f"   the ledger: {states(night)}")
    cancel_run(night.pk, actor="demo")
    demo.until(lambda: clean(night), 60)
    demo.say(f"   cancelled and given back: south {south.bots()} bots")

    demo.say("3/3 north freezes (SIGSTOP) while a cancelled run is given back on both servers")
    raid = start_run("Raid", [bots(2, "north"), bots(2, "south"), gravity(300, "south"), wait(3600)], actor="demo")
    demo.until(lambda: made(raid, 4), 60)
    north.signal(signal.SIGSTOP)
    cancel_run(raid.pk, actor="demo")
    demo.until(lambda: ("arena", "north") in outages.down_backends(), 60)
    demo.until(lambda: not Resource.objects.filter(run=raid, backend="south", state="live").exists(), 60)
    attempts = sorted(set(Resource.objects.filter(run=raid, backend="north").values_list("revert_attempts", flat=True)))
    demo.say(f"   south given back at once ({south.bots()} bots, gravity {south.gravity()}); north is down,")
    demo.say(f"   its rows wait, attempts spent: {attempts}")
    time.sleep(20)
    north.signal(signal.SIGCONT)
    demo.until(lambda: clean(raid), 120)
    demo.say(
        f"   north woke: run {raid.pk} cleanup {Run.objects.get(pk=raid.pk).cleanup_status}, {north.bots()} bots left"
    )
    demo.say(f"the modules' log: {demo.WEB}/admin/cleanup/moduleevent/")
