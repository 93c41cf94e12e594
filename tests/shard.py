"""A real sandbox shard process for tests, on a free port.

Use it by importing the fixtures into a test module::

    from tests.shard import shard, shard_process  # noqa: F401  (pytest fixtures)

    def test_something(shard):            # the shard's base URL, a str
        with override_settings(SANDBOX_SHARD_URL=shard): ...

    def test_other(shard_process):        # the process, with helpers
        shard_process.post("/faults", json={"down": "refuse"})

    def test_fleet(shard_fleet):          # two processes, north and south, as one fleet
        with shard_fleet.settings(): ...  # SANDBOX_SHARDS names both
        shard_fleet["north"].post("/faults", json={"down": "refuse"})

Each test gets its own process (started with ``--port 0 --save-every 0``: the system
picks the port, and the world is saved only on ``POST /save``, so nothing in a test
depends on timing), which is stopped after the test. `start_shard` starts one by hand,
by ``python -m eventsite.sandbox.shard`` or through ``manage.py sandbox_shard``.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from django.test import override_settings

from tests.servers import stop_process

ROOT = Path(__file__).resolve().parent.parent
STARTED = re.compile(r"listening on (?P<url>http://\S+) boot_id=(?P<boot_id>\S+)")
START_TIMEOUT_S = 15


class ShardProcess:
    """A running shard: its ``url``, the ``boot_id`` it started with, and helpers."""

    def __init__(self, process, logs):
        self.process = process
        self.logs = logs
        self.url = None
        self.boot_id = None
        self.http = httpx.Client(trust_env=False)

    def stdout(self):
        return (self.logs / "stdout").read_text(errors="replace")

    def stderr(self):
        return (self.logs / "stderr").read_text(errors="replace")

    def request(self, method, path, timeout=5.0, **kwargs):
        return self.http.request(method, self.url + path, timeout=timeout, **kwargs)

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, **kwargs):
        return self.request("POST", path, **kwargs)

    def put(self, path, **kwargs):
        return self.request("PUT", path, **kwargs)

    def delete(self, path, **kwargs):
        return self.request("DELETE", path, **kwargs)

    def switch(self):
        """The shard's dead-man's switch: each session, what it holds, what it gave back."""
        return self.get("/switch").json()["sessions"]

    def lapses(self):
        """What the switch gave back, one entry per session that lapsed."""
        return [s["lapsed"] for s in self.switch() if s["lapsed"] is not None]

    def stop(self, sig=signal.SIGTERM, timeout=5.0):
        """Stop the process (by ``sig``, then by force) and answer its exit status."""
        self.http.close()
        return stop_process(self.process, sig, timeout, wake=False)

    def _wait_started(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = STARTED.search(self.stdout())
            if match:
                self.url, self.boot_id = match["url"], match["boot_id"]
                break
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        if self.url is None:
            self.stop()
            raise RuntimeError(f"the shard did not start:\n{self.stdout()}\n{self.stderr()}")
        while time.monotonic() < deadline:
            try:
                if self.get("/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the shard at {self.url} never answered /health:\n{self.stderr()}")


@contextlib.contextmanager
def start_shard(*, via="module", save_every=0, port=0, extra=()):
    """Start a shard process, wait until ``/health`` answers, and stop it afterwards.

    ``via="module"`` runs ``python -m eventsite.sandbox.shard`` (no Django, quick);
    ``via="manage"`` runs ``manage.py sandbox_shard`` with ``DEBUG=1``.
    """
    if via == "module":
        command = [sys.executable, "-m", "eventsite.sandbox.shard"]
    elif via == "manage":
        command = [sys.executable, str(ROOT / "manage.py"), "sandbox_shard"]
    else:
        raise ValueError(f"via must be 'module' or 'manage', not {via!r}")
    command += ["--port", str(port), "--save-every", str(save_every), *extra]
    env = {**os.environ, "DEBUG": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # manage.py picks the site's settings
    logs = Path(tempfile.mkdtemp(prefix="sandbox-shard-"))
    with open(logs / "stdout", "wb") as out, open(logs / "stderr", "wb") as err:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    shard = ShardProcess(process, logs)
    try:
        shard._wait_started()
        yield shard
    finally:
        shard.stop(signal.SIGKILL)  # quick; stopping cleanly is tested on its own
        shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture
def shard_process():
    """A fresh shard process for the test (a `ShardProcess`)."""
    with start_shard() as process:
        yield process


@pytest.fixture
def shard(shard_process):
    """The base URL of a fresh shard process, e.g. ``http://127.0.0.1:40123``."""
    return shard_process.url


class ShardFleet:
    """Several shard processes by name, as ``SANDBOX_SHARDS`` names them."""

    def __init__(self, processes):
        self.processes = dict(processes)

    def __getitem__(self, name):
        return self.processes[name]

    def __iter__(self):
        return iter(self.processes)

    @property
    def shards(self):
        """``{name: url}``, the value of ``SANDBOX_SHARDS``."""
        return {name: process.url for name, process in self.processes.items()}

    def setting(self):
        """``SANDBOX_SHARDS`` as the environment gives it: ``north=http://…,south=http://…``."""
        return ",".join(f"{name}={url}" for name, url in self.shards.items())

    def settings(self, **more):
        """``override_settings`` pointing the sandbox module at this fleet (and ``more``)."""
        return override_settings(SANDBOX_SHARDS=self.shards, **more)


@pytest.fixture
def shard_fleet(shard_process):
    """Two fresh shard processes, ``north`` (the test's `shard_process`) and ``south``."""
    with start_shard() as south:
        yield ShardFleet({"north": shard_process, "south": south})
