"""Starting, halting and reading the worker processes of the reliability suite.

Every wait here is bounded: a scenario that does not converge fails with what it saw,
it does not hang the suite.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from django.conf import settings
from django.db.models import Q

from cleanup.models import UNRESOLVED, CleanupStatus, Resource, ResourceState, Run

PG_PROCESSES = [
    pytest.mark.reliability,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

CLAIM_TIMEOUT_S = 2
MAX_ATTEMPTS = 3


def database_url():
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


class Workers:
    """The processes a scenario started, with the moment each was seen dead."""

    def __init__(self, tmp_path):
        self.calls = tmp_path / "calls.jsonl"
        self.store = tmp_path / "store.json"
        self.procs = []
        self.died = {}

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABILITY_")}
        env.update(
            DATABASE_URL=database_url(),
            DEBUG="1",
            DJANGO_SETTINGS_MODULE="tests.reliability.worker_settings",
            EVENT_REVERT_BACKOFF_S="0",
            EVENT_CLAIM_TIMEOUT_S=str(CLAIM_TIMEOUT_S),
            EVENT_REVERT_MAX_ATTEMPTS=str(MAX_ATTEMPTS),
            EVENT_DEFAULT_BUDGET_MS="1000",
            RELIABILITY_CALLS=str(self.calls),
            RELIABILITY_STORE=str(self.store),
            LOG_LEVEL="ERROR",
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, *args, module="tests.reliability.sweeper", wrap=(), **env):
        """Start ``python -m module *args``; ``wrap`` is a command put before it (`faketime`)."""
        # Output goes to a file: a pipe nobody reads fills up and blocks a chatty cluster.
        log = self.calls.with_name(f"process-{len(self.procs)}.log")
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [*wrap, sys.executable, "-m", module, *args],
                cwd=settings.BASE_DIR,
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.log = log
        self.procs.append(proc)
        return proc

    @staticmethod
    def output(proc):
        """The last lines a process wrote, to explain its end."""
        return "\n".join(proc.log.read_text().splitlines()[-30:])

    def sweeper(self, *args, halt=None, wrap=(), **env):
        if halt:
            env["RELIABILITY_HALT"] = halt
        return self.start(*args, wrap=wrap, **env)

    def killed(self, proc):
        """SIGKILL ``proc`` from outside; answers the moment, which is also when its calls ended."""
        os.kill(proc.pid, signal.SIGKILL)
        at = time.time()
        self.died[proc.pid] = at
        self.wait(proc, timeout=10)
        return at

    def alive(self, proc):
        if proc.poll() is None:
            return True
        self.died.setdefault(proc.pid, time.time())
        return False

    def wait(self, proc, timeout=60):
        deadline = time.monotonic() + timeout
        while self.alive(proc):
            assert time.monotonic() < deadline, f"process {proc.pid} still running after {timeout} s"
            time.sleep(0.02)
        return proc.returncode

    def wait_until(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            for proc in self.procs:
                self.alive(proc)
            assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
            time.sleep(0.05)

    def stop_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.died.setdefault(proc.pid, time.time())

    def read_calls(self):
        """Every recorded call: verb, key, refs, pid, start, end (None: it never answered)."""
        if not self.calls.exists():
            return []
        calls = {}
        for line in self.calls.read_text().splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event["ev"] == "start":
                calls[event["id"]] = {**event, "start": event["t"], "end": None, "ok": None}
            else:
                calls[event["id"]].update(end=event["t"], ok=event.get("ok"))
        return list(calls.values())

    def overlaps(self, verbs=("revert", "restore")):
        """Pairs of calls on one ref that ran at the same time.

        A call that never answered ran until its process was seen dead, or is still running.
        """
        by_ref = defaultdict(list)
        for call in self.read_calls():
            if call["verb"] not in verbs:
                continue
            end = call["end"] or self.died.get(call["pid"], math.inf)
            for ref in call["refs"]:
                by_ref[ref].append((call["start"], end, call["pid"]))
        found = []
        for ref, spans in by_ref.items():
            spans.sort()
            latest_end, latest_pid = -math.inf, None
            for start, end, pid in spans:
                if start < latest_end:
                    found.append((ref, latest_pid, pid))
                if end > latest_end:
                    latest_end, latest_pid = end, pid
        return found

    def calls_per_ref(self, verbs=("revert", "restore")):
        counts = defaultdict(int)
        for call in self.read_calls():
            if call["verb"] in verbs:
                for ref in call["refs"]:
                    counts[ref] += 1
        return counts

    def given_back_per_ref(self, verbs=("revert", "restore")):
        """How many calls answered success for each ref: a ref with two was given back twice."""
        counts = defaultdict(int)
        for call in self.read_calls():
            if call["verb"] in verbs and call["ok"]:
                for ref in call["refs"]:
                    counts[ref] += 1
        return counts

    def given_back_twice(self, verbs=("revert", "restore")):
        return sorted(ref for ref, n in self.given_back_per_ref(verbs).items() if n > 1)


FAKETIME = "/usr/bin/faketime"


def faketime(offset_s):
    """The command and environment that run a process with its wall clock ``offset_s`` off.

    Debian's libfaketime fakes CLOCK_MONOTONIC too by default, and then a timed wait of
    Python's (a lock, an Event, the engine's wait on its thread pool under a deadline)
    computes its deadline on the faked clock and hands it to a wait that does not keep
    it: here a plain ``Event().wait(1)`` did not return for minutes, 90 s ahead or behind,
    so the engine's wait on its pool would return only when a call ends.
    ``DONT_FAKE_MONOTONIC=1`` leaves CLOCK_MONOTONIC real, which is also what a machine
    whose NTP is off looks like: its wall clock is wrong, its monotonic clock ticks true.
    ``FAKETIME_NO_CACHE=1`` alone did not help (the wait still hung 90 s behind), and a
    fixed offset needs no re-reading of its spec, so it is not set.
    With it left real, though, ``time.sleep`` fails (EINVAL), so a sweeper that sees
    ``RELIABILITY_CLOCK_OFFSET`` sleeps by timed waits (`sweeper`), and the recording module
    subtracts the offset to write true times for its calls.
    """
    if not os.path.exists(FAKETIME):
        pytest.skip(f"needs {FAKETIME} (apt-get install faketime)")
    return [FAKETIME, "-f", f"{offset_s:+d}s"], {"DONT_FAKE_MONOTONIC": "1", "RELIABILITY_CLOCK_OFFSET": str(offset_s)}


@pytest.fixture
def workers(tmp_path):
    w = Workers(tmp_path)
    yield w
    w.stop_all()


def settled():
    """Nothing claimed and nothing the sweep would still try.

    One query, one snapshot: asked in two, a row claimed between them (failed, then
    reverting) would be in neither, and the sweep would look settled while it works.
    """
    working = Q(state=ResourceState.REVERTING) | Q(
        state__in=(ResourceState.LIVE, ResourceState.FAILED), retryable=True, revert_attempts__lt=MAX_ATTEMPTS
    )
    return not Resource.objects.filter(working).exists()


def status_disagreements():
    """Ended runs whose cleanup status is not what their rows say, once the sweep is settled."""
    wrong = []
    for run in Run.objects.all():
        rows = Resource.objects.filter(run=run)
        if not rows.exists():
            expected = CleanupStatus.NOT_REQUIRED
        elif not rows.filter(state__in=UNRESOLVED).exists():
            expected = CleanupStatus.COMPLETE
        else:
            expected = CleanupStatus.INCOMPLETE
        if run.cleanup_status != expected:
            wrong.append((run.pk, run.cleanup_status, expected))
    return wrong


def drive_until_settled(workers, timeout, *, halts=(), concurrency=1):
    """Keep ``concurrency`` sweepers going until the sweep is settled and every halt was handed out.

    The first sweepers started carry ``halts`` (one each, in order); a sweeper that dies is
    replaced. Answers the halts that killed their process.
    """
    halts = list(halts)
    running, killed = [], []
    deadline = time.monotonic() + timeout

    def reap():
        for proc, halt in list(running):
            if not workers.alive(proc):
                running.remove((proc, halt))
                assert proc.returncode == -signal.SIGKILL, workers.output(proc)
                killed.append(halt)

    while True:
        reap()
        if settled():
            time.sleep(0.5)  # a sweeper that halts itself right after its last verdict is dying now
            reap()
            for proc, _ in running:
                proc.kill()
                workers.wait(proc)
            return killed
        while len(running) < concurrency:
            halt = halts.pop(0) if halts else None
            running.append((workers.sweeper("--forever", halt=halt), halt))
        assert time.monotonic() < deadline, f"not settled after {timeout} s; halts left {halts}"
        time.sleep(0.05)


def stopped(proc):
    """Has the process stopped itself (SIGSTOP)?"""
    try:
        with open(f"/proc/{proc.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


def stop_then_take_over(workers, **stale_env):
    """A sweeper stops after its module answered; once its claim expired, another sweeps."""
    stale = workers.sweeper(halt="stop:after_answer:1", **stale_env)
    workers.wait_until(lambda: stopped(stale), timeout=60, what="the sweeper to stop after its answer")
    time.sleep(CLAIM_TIMEOUT_S + 0.5)
    assert workers.wait(workers.sweeper(), timeout=60) == 0
    return stale


def resume(workers, stale):
    os.kill(stale.pid, signal.SIGCONT)
    assert workers.wait(stale, timeout=60) == 0, workers.output(stale)
