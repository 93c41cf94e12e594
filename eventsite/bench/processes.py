"""The processes the bench starts, and how it stops every one of them.

Each child runs in a session of its own, so that stopping it also stops what it started
(django-q2's workers) and a Ctrl-C at the terminal reaches the bench alone, which then
stops its children itself. On Linux a child is also told to stop when the bench dies
outright. Output goes to a temporary file, quoted when a child fails.
"""

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time

import httpx
from django.conf import settings

from .scratch import BenchError

STOP_TIMEOUT_S = 15
START_TIMEOUT_S = 30
LISTENING = re.compile(r"listening on (?P<url>http://\S+)")


def child_env(url, settings_module=None, **extra):
    """The environment of a child working on the scratch database ``url``.

    ``settings_module`` None keeps the caller's settings module (the site's when unset).
    """
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DEBUG": "0",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-only-" + secrets.token_hex(24),
    }
    env.setdefault("DJANGO_SETTINGS_MODULE", "eventsite.settings")
    if settings_module:
        env["DJANGO_SETTINGS_MODULE"] = settings_module
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _die_with_parent():
    with contextlib.suppress(Exception):  # Linux only: elsewhere the try/finally is all there is
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Child:
    """A process of the bench's, stopped by `stop` (SIGTERM, then SIGKILL to its session)."""

    def __init__(self, name, argv, env, stdin=subprocess.DEVNULL, stdout=None):
        self.name = name
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            argv,
            cwd=settings.BASE_DIR,
            env=env,
            stdin=stdin,
            stdout=stdout or self.log,
            stderr=self.log,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def started(self, wait):
        """Answer ``wait()``; a child that never got going is stopped before the error goes up."""
        try:
            return wait()
        except BaseException:
            self.stop()
            raise

    def output(self, tail=3000):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-tail:]

    def failed(self, what):
        return BenchError(f"{self.name} {what}:\n{self.output()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the leader stops its own workers cleanly
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its session is left
        self.proc.wait()
        self.log.close()


class LineChild(Child):
    """A child that answers one JSON line on stdout per JSON command read on stdin."""

    def __init__(self, name, argv, env):
        super().__init__(name, argv, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.started(self.read)

    def send(self, **command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def read(self):
        line = self.proc.stdout.readline()
        while line and not line.startswith("{"):  # something in the site printed to stdout
            line = self.proc.stdout.readline()
        if not line:
            raise self.failed("stopped")
        answer = json.loads(line)
        if answer.get("error"):
            raise BenchError(f"{self.name}: {answer['error']}")
        return answer

    def ask(self, **command):
        self.send(**command)
        return self.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the end of its commands: it exits on its own
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_TIMEOUT_S)
        super().stop()


class Shard(Child):
    """A real sandbox shard on a free port; its faults are steered over HTTP."""

    def __init__(self, name="", wait=True):
        """Start the shard; with ``wait`` False its ``url`` is known only after `wait_listening`."""
        self.shard_name = name
        argv = [sys.executable, "-m", "eventsite.sandbox.shard", "--port", "0", "--save-every", "0"]
        label = f"the sandbox shard {name}" if name else "the sandbox shard"
        super().__init__(label, argv, {**os.environ, "PYTHONUNBUFFERED": "1"})
        self.http = httpx.Client(trust_env=False, timeout=10)
        self.url = self.started(self.wait_listening) if wait else None

    @classmethod
    def start_many(cls, names, keep):
        """Shards named ``names``, started at once and then waited for: each start is mostly
        the interpreter's own (0.2 s of CPU), so 100 shards one after another take 20 s or more
        where starting them together takes what the cores can do (9 s on two cores).
        ``keep`` is given each shard as soon as its process runs (the caller stops them all,
        whatever happens). The first may wait for the whole start of them all: the time
        allowed grows by a quarter of a second per shard."""
        shards = [keep(cls(name, wait=False)) for name in names]
        for shard in shards:
            shard.url = shard.wait_listening(START_TIMEOUT_S + 0.25 * len(shards))
        return shards

    def wait_listening(self, timeout_s=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if match := LISTENING.search(self.output(tail=10_000)):
                return match["url"]
            time.sleep(0.02)
        raise self.failed("did not start")

    def faults(self, **faults):
        self.http.post(self.url + "/faults", json=faults).raise_for_status()

    def post(self, path, **body):
        reply = self.http.post(self.url + path, json=body)
        reply.raise_for_status()
        return reply.json()

    def save(self):
        """Save the world now: what a rollback restores."""
        return self.post("/save")

    def restart(self, mode="rollback"):
        """Restart the shard (a new boot id); a rollback brings back the world as last saved."""
        return self.post("/restart", mode=mode)

    def boot_id(self):
        """The boot id the shard answers now (it must not be down)."""
        reply = self.http.get(self.url + "/health")
        reply.raise_for_status()
        return reply.json()["boot_id"]

    def event_creatures(self):
        """The creatures event spawns made that are still in the world."""
        reply = self.http.get(self.url + "/creatures")
        reply.raise_for_status()
        return [c for c in reply.json()["creatures"] if c.get("key")]

    def stop(self):
        self.http.close()
        super().stop()


class Cluster(Child):
    """``manage.py qcluster``, as deployed, with the environment it is given."""

    def __init__(self, env):
        super().__init__("the django-q2 cluster", [sys.executable, "manage.py", "qcluster"], env)

    def check_alive(self):
        if self.proc.poll() is not None:
            raise self.failed("stopped")
