"""`make demo` brings the shard, the cluster and the web server up, and stops them all."""

import os
import re
import signal
import socket
import subprocess
import time

import httpx
import pytest
from django.conf import settings


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def test_make_demo_starts_everything_and_ctrl_c_stops_it(tmp_path):
    web, shard = free_port(), free_port()
    env = {**os.environ, "DEMO_STORY": "0", "DEMO_WEB_PORT": str(web), "DEMO_SHARD_PORT": str(shard),
           "EVENTSITE_VAR_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    demo = subprocess.Popen(["make", "-s", "demo"], cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, pids = [], {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            assert line, "make demo ended before it was ready:\n" + "".join(lines)
            lines.append(line)
            started = re.search(r"started (\w+) \(pid (\d+)\)", line)
            if started:
                pids[started[1]] = int(started[2])
            if "ready: admin" in line:
                break
        else:
            pytest.fail("make demo was not ready within 120 s:\n" + "".join(lines))

        assert set(pids) == {"shard", "cluster", "web"}
        login = httpx.get(f"http://127.0.0.1:{web}/admin/login/", timeout=5)
        assert login.status_code == 200 and "Django administration" in login.text
        assert httpx.get(f"http://127.0.0.1:{shard}/health", timeout=5).status_code == 200
        assert re.search(r"user demo\s+password \S{8,}", lines[-1]), lines[-1]
    finally:
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        rest, _ = demo.communicate(timeout=60)

    assert "stopped cluster" in rest and "stopped web" in rest and "stopped shard" in rest
    for name, pid in pids.items():
        assert not pid_alive(pid), f"{name} is still running after Ctrl-C"
        assert group_gone(pid), f"a process {name} started (a worker) is still running after Ctrl-C"
    for port in (web, shard):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers"
