"""A PostgreSQL server of the test's own, to stop and start under running sweepers.

The suite's database server (127.0.0.1:5432) is shared with every other test and person:
a test that restarts PostgreSQL starts its own with ``initdb`` from the server's binaries
(`PG_BIN`) in a temporary directory, on a free port of loopback, and removes it after.
As root, the server runs as the ``postgres`` user (PostgreSQL refuses to run as root).
Every command here is bounded by a timeout.
"""

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


def _server_bin():
    """The newest PostgreSQL server's binaries Debian installed, or ``RELIABILITY_PG_BIN``."""
    given = os.environ.get("RELIABILITY_PG_BIN")
    if given:
        return Path(given)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _server_bin()
USER = "postgres"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivatePostgres:
    """``initdb``, ``pg_ctl start/stop/restart`` and ``psql`` on a server nobody else uses."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="privatepg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = free_port()
        self.as_owner = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam(USER)
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self.as_owner = ["runuser", "-u", USER, "--"]

    def _run(self, *command, timeout=60):
        done = subprocess.run(
            [*self.as_owner, *command], capture_output=True, text=True, timeout=timeout, cwd=self.dir, check=False
        )
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}\n{self.tail()}"
        return done.stdout

    def tail(self, lines=20):
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except (FileNotFoundError, PermissionError):
            return ""

    def init(self):
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
            timeout=120,
        )
        return self

    def start(self):
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        pg_ctl = str(PG_BIN / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "30", "start")

    def stop(self, mode="fast"):
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def restart(self, pause=0.2):
        """Stop (``-m fast``: every session is cut), wait ``pause``, start; answers (stopped, back) as Unix times."""
        self.stop("fast")
        stopped = time.time()
        time.sleep(pause)
        self.start()
        return stopped, time.time()

    def url(self, database):
        return f"postgres://{USER}@127.0.0.1:{self.port}/{database}"

    def psql(self, database, sql, timeout=30):
        done = subprocess.run(
            [
                str(PG_BIN / "psql") if (PG_BIN / "psql").exists() else "psql",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                USER,
                "-d",
                database,
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"psql failed: {done.stderr}"
        return done.stdout.strip()

    def query_json(self, database, sql):
        """The rows of ``sql`` as a list of dicts (``json_agg`` of its rows)."""
        return json.loads(self.psql(database, f"SELECT coalesce(json_agg(q), '[]') FROM ({sql}) q") or "[]")

    def create_database(self, name):
        self.psql("postgres", f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self):
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop("immediate")
            except (AssertionError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def migrate(url, env, timeout=180):
    """``manage.py migrate`` of the site onto the database at ``url``, in a process of its own."""
    from django.conf import settings

    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=settings.BASE_DIR,
        env={**env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"migrate failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture
def private_pg():
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"needs PostgreSQL's initdb in {PG_BIN}")
    server = PrivatePostgres()
    try:
        server.init().start()
        yield server
    finally:
        server.destroy()
