"""`make demo` brings the shard, the cluster and the web server up, and stops them all."""

import os
import re
import socket
import time

import httpx
import pytest

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


def test_make_demo_starts_everything_and_ctrl_c_stops_it(tmp_path):
    demo = Demo(tmp_path, story=False)
    try:
        ready = demo.read_until("ready: admin", 120)
        pids = {m[0]: int(m[1]) for m in re.findall(r"started (\w+) \(pid (\d+)\)", "".join(demo.lines))}
        assert set(pids) == {"shard", "cluster", "web"}
        login = httpx.get(f"{demo.url}/admin/login/", timeout=5)
        assert login.status_code == 200 and "Django administration" in login.text
        assert httpx.get(f"http://127.0.0.1:{demo.shard}/health", timeout=5).status_code == 200
        assert re.search(r"user demo\s+password \S{8,}", ready), ready
    finally:
        rest = demo.stop()

    assert "stopped cluster" in rest and "stopped web" in rest and "stopped shard" in rest
    for name, pid in pids.items():
        assert not pid_alive(pid), f"{name} is still running after Ctrl-C"
        assert group_gone(pid), f"a process {name} started (a worker) is still running after Ctrl-C"
    for port in (demo.web, demo.shard):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers"
