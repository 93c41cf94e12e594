"""`make demo` as a subprocess for tests: started on free ports, read line by line, stopped
as Ctrl-C stops it."""

import os
import signal
import socket
import subprocess
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
        }
        self.lines = []
        self.process = subprocess.Popen(
            ["make", "-s", "demo"],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def read_until(self, marker, seconds):
        """Read lines until one holds ``marker``; fail the test with what was printed."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            assert line, "make demo ended early:\n" + "".join(self.lines)
            self.lines.append(line)
            if marker in line:
                return line
        pytest.fail(f"make demo printed no {marker!r} within {seconds} s:\n" + "".join(self.lines))

    def stop(self):
        """Ctrl-C, as a terminal sends it to the whole foreground group; answers the rest."""
        os.killpg(self.process.pid, signal.SIGINT)
        rest, _ = self.process.communicate(timeout=60)
        return rest
