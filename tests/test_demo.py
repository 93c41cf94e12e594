"""`make demo` brings two shards (north and south), the cluster and the web server up, and
stops them all; its story shows a shard's outage holding only its own work."""

import os
import re
import socket
import subprocess
import time

import httpx
import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from tests.databases import scratch_database, server_url  # noqa: F401  (the fixture)
from tests.demo import Demo

pytestmark = pytest.mark.slow


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def group_gone(pgid, seconds=10):
    """True once no process of the group is left; orphaned workers may take a moment."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_make_demo_starts_everything_and_ctrl_c_stops_it(tmp_path, scratch_database):  # noqa: F811
    # The database DATABASE_URL names is not there yet: the demo makes it.
    name = scratch_database.rpartition("/")[2]
    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
    demo = Demo(tmp_path, story=False, database_url=scratch_database)
    try:
        ready = demo.read_until("ready: admin", 120)
        # Its first line says which database: here the scratch one the test gave it.
        assert demo.lines[0].strip() == f"demo: database: DATABASE_URL ({scratch_database.rpartition('@')[2]})"
        demo.read_until("shards: north", 10)
        pids = {m[0]: int(m[1]) for m in re.findall(r"started ([\w-]+) \(pid (\d+)\)", "".join(demo.lines))}
        assert set(pids) == {"shard-north", "shard-south", "cluster", "web"}
        login = httpx.get(f"{demo.url}/admin/login/", timeout=5)
        assert login.status_code == 200 and "Eventsite staff" in login.text
        boots = {httpx.get(f"{url}/health", timeout=5).json()["boot_id"] for url in demo.shards.values()}
        assert len(boots) == 2, "two shards, each with its own boot"
        assert re.search(r"user demo\s+password \S{8,}", ready), ready
        assert f"shards: north {demo.shards['north']}, south {demo.shards['south']}" in "".join(demo.lines)
        # The by-hand command it prints acts on this demo, wherever its ports and database are.
        command = demo.read_until("a token for the API:", 10).split("a token for the API:", 1)[1].strip()
        assert f"SANDBOX_SHARDS=north={demo.shards['north']},south={demo.shards['south']}" in command
        made = subprocess.run(command, shell=True, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()  # create_token prints the key alone, once
        runs = httpx.get(f"{demo.url}/api/v1/events/runs/", headers={"Authorization": f"Token {token}"}, timeout=5)
        assert runs.status_code == 200, "the printed command made its token in another database"
        env_file = (tmp_path / "demo-env.sh").read_text()
        assert f"export SANDBOX_SHARDS=north={demo.shards['north']},south={demo.shards['south']}" in env_file
        assert f"export DATABASE_URL={scratch_database}" in env_file
    finally:
        rest = demo.stop()

    for name in ("cluster", "web", "shard-north", "shard-south"):
        assert f"stopped {name}" in rest
    for name, pid in pids.items():
        assert not pid_alive(pid), f"{name} is still running after Ctrl-C"
        assert group_gone(pid), f"a process {name} started (a worker) is still running after Ctrl-C"
    for port in (demo.web, demo.shard, demo.shard2):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers"


@pytest.mark.timeout(400)
def test_the_story_takes_south_down_while_norths_runs_are_given_back(tmp_path, scratch_database):  # noqa: F811
    demo = Demo(tmp_path, story=True, database_url=scratch_database)
    try:
        demo.read_until("the story is told", 300)
    finally:
        demo.stop()
    told = "".join(demo.lines)

    def outcome(name):
        found = re.search(rf"run \d+ {re.escape(name)}: (\w+), cleanup (\w+)", told)
        assert found, f"no outcome for {name!r} in:\n{told}"
        return found[1], found[2]

    # The core went away with a raid live on north: north gave back by itself, and the core,
    # back, recorded it without calling north for those rows.
    assert re.search(
        r"north gave back by itself after \d+ s without a word from the core: 5 orcs removed, "
        r"wolf-den back to 0.5",
        told,
    ), told
    assert re.search(
        r"Night raid \(north; the core goes away\): aborted, cleanup complete; "
        r"6 rows recorded as given back by the switch, 0 calls to north for them",
        told,
    ), told
    assert re.search(
        r"their reason: given back by sandbox/north's own switch at \d\d:\d\d: "
        r"no word from the core for \d+ s",
        told,
    ), told
    assert outcome("Wolf hunt (north; its wolves refuse to leave)") == ("completed", "incomplete")
    assert outcome("Orc invasion (south; outlives its shard's outage)") == ("completed", "complete")
    assert outcome("Border skirmish (south; ends during the outage)") == ("completed", "complete")
    assert outcome("Ogre patrol (north; given back while south is down)") == ("completed", "complete")
    assert outcome("Goblin night (south; cancelled)") == ("cancelled", "complete")
    assert outcome("Festival boost to 3 (north)") == ("completed", "complete")
    assert outcome("Festival boost to 5 (north; overlaps)") == ("completed", "complete")
    assert "troll step: waiting: sandbox/south is down since" in told
    # North's patrol was given back while south was still down, its skirmish's rows waiting.
    patrol = re.search(
        r"run \d+ \(north\): completed, cleanup complete; run \d+ \(south\): completed, cleanup pending", told
    )
    assert patrol, told
    assert "north's orc-camp rate back to 1.0" in told
    assert re.search(r"run \d+ waits for a person", told)
    # Staff were told, by the demo's own webhook, signed: the wolf hunt that gave up, south's outage.
    assert "alert sent to staff (webhook, signature checked): cleanup.gave_up, run" in told
    assert "alert sent to staff (webhook, signature checked): module.down, sandbox/south" in told
    assert re.search(r"by hand: env DATABASE_URL=\S+ .*SANDBOX_SHARDS=\S+ .*manage.py cleanup_run \d+ --reset", told)
