"""A healthy core for ten minutes, beside the rest of the suite (rule 34).

The issue's promise: a core that renews on time never sets a backend's switch off over a
ten-minute run. Ten minutes of one test would be ten minutes of the suite, so the run is
started in the background when the session starts (a sandbox shard, a django-q2 cluster of
the site's settings on a database of its own, a raid holding creatures and a boost), and
the test that reads its verdict runs last, when the run has had its ten minutes while the
other tests loaded the machine. Run alone, that test waits out the ten minutes itself.

A pytest plugin (``-p tests.healthy_core`` in pyproject.toml): it starts the run when the
test is among those chosen, and stops it when the session ends.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql

TEST_NAME = "test_a_core_renewing_on_time_for_ten_minutes_never_sets_the_switch_off"
RUN_S = 600
# A renewal every 10 s, a lapse after 30 s of silence: twenty ttls in the ten minutes, and the
# cluster's own keepalive loop (a third of the ttl is shorter than the minute schedule).
TTL_S = 30
RAID = [
    {"action": "sandbox.spawn", "params": {"creature": "orc", "count": 3, "at": "north-gate"}},
    {"action": "core.lease", "params": {"lease": "sandbox.spawner_rate", "target": "orc-camp", "value": 5}},
    {"action": "core.wait", "params": {"seconds": 3600}},
]


class HealthyCore:
    """The background run: started by `start` in a thread of its own, read by `verdict`."""

    def __init__(self, var_dir: Path) -> None:
        self.var_dir = var_dir
        from tests.databases import server_url

        self.name = f"healthy_core_{os.getpid()}"
        self.url = server_url(self.name)
        self.ready = threading.Event()
        self.error: str | None = None
        self.shard = None
        self._stack = contextlib.ExitStack()  # the shard's process, stopped by `stop`
        self.cluster: subprocess.Popen | None = None
        self.log = var_dir / "cluster.log"

    @staticmethod
    def root() -> Path:
        from django.conf import settings

        return Path(settings.BASE_DIR)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")}
        env.update(
            DATABASE_URL=self.url,
            DEBUG="1",
            EVENTSITE_VAR_DIR=str(self.var_dir),
            SANDBOX_SHARD_URL=self.shard.url,
            SANDBOX_SHARDS="",
            EVENT_DEADMAN_TTL_S=str(TTL_S),
            LOG_LEVEL="WARNING",
        )
        return env

    def manage(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [sys.executable, str(self.root() / "manage.py"), *args],
            cwd=self.root(),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> None:
        threading.Thread(target=self._start, name="healthy core", daemon=True).start()

    def _start(self) -> None:
        from tests.databases import server_url
        from tests.shard import start_shard

        try:
            with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
            self.shard = self._stack.enter_context(start_shard())
            self.manage("migrate", "-v0")
            with open(self.log, "w") as out:
                self.cluster = subprocess.Popen(
                    [sys.executable, str(self.root() / "manage.py"), "qcluster"],
                    cwd=self.root(),
                    env=self.env(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.manage("start_run", "--name", "healthy core, ten minutes", "--steps", json.dumps(RAID))
        except Exception as exc:  # read by the test, with the cluster's log
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()

    def query(self, statement: str) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(statement).fetchall()

    def armed_at(self) -> float | None:
        """Seconds since the epoch at which the core's session with the shard was armed."""
        rows = self.query("SELECT extract(epoch FROM armed_at) FROM cleanup_deadmanswitch WHERE armed_at IS NOT NULL")
        return float(rows[0][0]) if rows else None

    def switch(self) -> list[dict]:
        return httpx.get(f"{self.shard.url}/switch", timeout=5).json()["sessions"]

    def creatures(self) -> list[dict]:
        return [c for c in httpx.get(f"{self.shard.url}/creatures", timeout=5).json()["creatures"] if c["key"]]

    def cluster_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()[-4000:]
        return ""

    def describe(self) -> str:
        """What a failed verdict shows: the run, its ledger and log, the switch, the cluster."""
        parts = []
        tables = {
            "run": "SELECT status, cleanup_status, wake_at, ended_at FROM cleanup_run",
            "steps": "SELECT position, action_id, status, attempts, last_error FROM cleanup_step",
            "ledger": "SELECT kind, ref, state, revert_attempts, last_error FROM cleanup_resource",
            "run log": "SELECT at, kind, detail FROM cleanup_runlog ORDER BY seq DESC LIMIT 15",
            "switch rows": "SELECT * FROM cleanup_deadmanswitch",
            "module events": "SELECT at, kind, detail FROM cleanup_moduleevent ORDER BY seq DESC LIMIT 10",
        }
        for title, read in (
            *((title, functools.partial(self.query, statement)) for title, statement in tables.items()),
            ("shard's switch", self.switch),
            ("shard's creatures", self.creatures),
        ):
            try:
                parts.append(f"{title}: {read()!r}")
            except Exception as exc:  # noqa: BLE001 (a description; each part on its own)
                parts.append(f"{title}: could not read ({type(exc).__name__}: {exc})")
        return "\n".join(parts) + f"\ncluster log (last 4,000 characters):\n{self.cluster_log()}"

    def stop(self) -> None:
        from tests.databases import server_url

        if self.cluster is not None and self.cluster.poll() is None:
            self.cluster.send_signal(signal.SIGTERM)
            try:
                self.cluster.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.cluster.pid, signal.SIGKILL)
                self.cluster.wait()
        with contextlib.suppress(Exception):
            self._stack.close()
        with contextlib.suppress(psycopg.Error), psycopg.connect(server_url("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))


def wait_until(check, seconds: float, every: float = 1.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(every)
    return check()


CORE = pytest.StashKey["HealthyCore"]()


@pytest.hookimpl(trylast=True)  # after `-k` and `-m` chose the tests
def pytest_collection_modifyitems(session, config, items):
    """The verdict is read last, after the run's ten minutes."""
    last = [item for item in items if item.name == TEST_NAME]
    if last:
        items[:] = [item for item in items if item not in last] + last


def pytest_collection_finish(session):
    """The run starts with the session, when its test was chosen."""
    import tempfile

    if session.config.option.collectonly or not any(item.name == TEST_NAME for item in session.items):
        return
    core = HealthyCore(Path(tempfile.mkdtemp(prefix="healthy-core-")))
    session.config.stash[CORE] = core
    core.start()


def pytest_unconfigure(config):
    core = config.stash.get(CORE, None)
    if core is not None:
        core.stop()


@pytest.fixture
def healthy_core(request):
    """The run started with the session (its test's own fixture)."""
    core = request.config.stash.get(CORE, None)
    if core is None:
        pytest.fail("the healthy core was not started: run its test through `make test` or pytest")
    return core
