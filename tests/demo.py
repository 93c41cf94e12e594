"""`make demo` as a subprocess for tests: started on free ports, read line by line, stopped
as Ctrl-C stops it."""

import os
import queue
import signal
import socket
import subprocess
import threading
import time

import pytest
from django.conf import settings


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Demo:
    def __init__(self, var_dir, story, database_url):
        self.web, self.shard, self.shard2 = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.web}"
        self.shards = {"north": f"http://127.0.0.1:{self.shard}", "south": f"http://127.0.0.1:{self.shard2}"}
        env = {
            **os.environ,
            "DEMO_STORY": "1" if story else "0",
            "DEMO_WEB_PORT": str(self.web),
            "DEMO_SHARD_PORT": str(self.shard),
            "DEMO_SHARD2_PORT": str(self.shard2),
            "EVENTSITE_VAR_DIR": str(var_dir),
            "DATABASE_URL": database_url,
            # As `make demo` runs for a person: the site's settings, not the tests' (pytest-django
            # puts those in the environment; they run django-q2's tasks inline).
            "DJANGO_SETTINGS_MODULE": "eventsite.settings",
        }
        self.lines = []
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            ["make", "-s", "demo"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        # A thread reads the output, so a demo that goes quiet fails at the deadline with
        # what it printed and when, instead of blocking the test until pytest's own timeout.
        self._lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.times: list[float] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self._lines.put((time.monotonic() - self.started, line))
        self._lines.put(None)

    def printed(self):
        """What the demo printed, each line with the seconds since it started."""
        return "".join(f"[{t:6.1f} s] {line}" for t, line in zip(self.times, self.lines, strict=True))

    def read_until(self, marker, seconds):
        """Read lines until one holds ``marker``; fail the test with what was printed."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._lines.get(timeout=left)
            except queue.Empty:
                break
            assert item is not None, "make demo ended early:\n" + self.printed()
            at, line = item
            self.times.append(at)
            self.lines.append(line)
            if marker in line:
                return line
        pytest.fail(f"make demo printed no {marker!r} within {seconds} s:\n" + self.printed())

    def stop(self):
        """Ctrl-C, as a terminal sends it to the whole foreground group; answers the rest."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            pytest.fail("make demo did not stop within 60 s of Ctrl-C:\n" + self.printed())
        rest = []
        try:
            while (item := self._lines.get(timeout=10)) is not None:
                rest.append(item[1])
        except queue.Empty:
            pytest.fail("make demo stopped, but something it started still holds its output:\n" + "".join(rest))
        return "".join(rest)
