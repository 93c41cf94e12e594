"""What the tests' real server processes share (`tests.luanti`, `tests.arena`, `tests.shard`):
a free port, and stopping, killing, pausing and resuming a process a test started."""

import contextlib
import os
import signal
import socket
import subprocess


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process, sig=signal.SIGTERM, timeout=10.0, wake=True):
    """Stop ``process`` by ``sig``, by force after ``timeout`` seconds, and answer its exit
    status (None when it never started). ``wake``: SIGCONT first, as a paused one cannot stop."""
    if process is None:
        return None
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if wake:
                os.kill(process.pid, signal.SIGCONT)
            process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    return process.returncode


class ServerProcess:
    """A game server a test runs: ``process`` is its `subprocess.Popen` once started."""

    process = None
    stop_timeout = 10.0

    def running(self):
        return self.process is not None and self.process.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=None):
        """Stop the server (SIGTERM: as an operator would) and answer its exit status."""
        return stop_process(self.process, sig, self.stop_timeout if timeout is None else timeout)

    def kill(self):
        """``kill -9``: what the server held only in its memory is lost."""
        return self.stop(signal.SIGKILL)

    def pause(self):
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.process.pid, signal.SIGCONT)
