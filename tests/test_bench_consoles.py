"""The bench of waiting consoles' own arithmetic: the processor time it reports for the web
server, and how long after a change each slow probe was sent. (The bench itself, with its
figures, is run by hand: docs/benchmarks.md.)"""

import argparse
import subprocess
import sys
import time

from eventsite.bench.consoles import Bench, cpu_seconds

BUSY = "import os, time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def test_the_processor_time_of_a_process_counts_its_children():
    # A parent that sleeps, with a child that spins for 0.6 s of processor time: what the
    # parent's tree used is the child's, which the parent alone would not show.
    spin = BUSY.format(s=0.6)
    child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {spin!r}]); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", child])
    try:
        before = cpu_seconds(parent.pid)
        time.sleep(1.5)
        used = cpu_seconds(parent.pid) - before
        assert 0.4 <= used <= 1.2, used
    finally:
        parent.kill()
        parent.wait()


def test_a_process_gone_counts_no_processor_time():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert cpu_seconds(gone.pid) == 0.0


def test_a_slow_probe_is_timed_from_the_last_change_before_it():
    args = argparse.Namespace(clients=1, changes=3)
    bench = Bench(args, [], 0, "postgres://unused")
    bench.committed = {0: 100.0, 1: 103.0, 2: 106.0}
    probes = {
        "healthz": [0.5, 0.05, 0.3],
        "healthz_at": [103.04, 104.0, 99.0],
        "ledger": [0.25],
        "ledger_at": [106.2],
    }
    # 40 ms after the second change, not 3,040 ms after the first; one before any change.
    assert bench.slow(probes) == [("healthz", 500, 40), ("healthz", 300, -1000), ("ledger", 250, 200)]
