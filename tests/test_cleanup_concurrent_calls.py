"""A pass makes its groups' calls concurrently, within the pass's and each module's limit."""

import os
import threading
import time

import pytest
from django.test import override_settings

from cleanup import calls, registry
from cleanup.registry import RegistryError
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


class Gate:
    """A revert that waits until ``together`` calls are in it at once, and counts them."""

    def __init__(self, together):
        self.barrier = threading.Barrier(together, timeout=10)
        self.lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.threads = set()

    def __call__(self, **kwargs):
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.threads.add(threading.get_ident())
        try:
            self.barrier.wait()  # broken (an exception, so a failure) unless enough run at once
            time.sleep(0.02)
        finally:
            with self.lock:
                self.running -= 1
        return {"ok": True, "failed": []}


def a_run_of(groups):
    run = make_run()
    for i in range(groups):
        make_rows(make_step(run), [f"orc-{i}"])
    return run


@override_settings(EVENT_CALL_CONCURRENCY=3)
def test_it_makes_up_to_the_limit_of_calls_at_once():
    gate = Gate(3)
    registry.register_action(FakeAction(revert=gate))
    run = a_run_of(6)

    sweep()

    assert set(states(run).values()) == {"reverted"}
    assert gate.most_at_once == 3


@override_settings(EVENT_CALL_CONCURRENCY=8)
def test_a_modules_max_concurrency_caps_its_calls():
    gate = Gate(2)
    action = FakeAction(revert=gate)
    action.max_concurrency = 2
    registry.register_action(action)
    run = a_run_of(6)

    sweep()

    assert set(states(run).values()) == {"reverted"}
    assert gate.most_at_once == 2


@override_settings(EVENT_CALL_CONCURRENCY=1)
def test_the_calls_reuse_their_workers():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = a_run_of(10)
    started = calls._workers._started
    sweep()

    assert set(states(run).values()) == {"reverted"}
    assert calls._workers._started - started <= 1, "a thread per call"


def test_a_call_that_outlives_its_budget_does_not_hold_up_the_next_call():
    release = threading.Event()
    first = calls.call(lambda: release.wait(10), budget_ms=20, what="hangs")
    second = calls.call(lambda: {"ok": True}, budget_ms=2000, what="answers")
    release.set()
    assert first.timed_out and first.still_running is not None
    assert second.raw == {"ok": True}


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "4"])
def test_it_refuses_a_max_concurrency_that_is_not_a_positive_whole_number(value):
    action = FakeAction(id="test.bad")
    action.max_concurrency = value
    with pytest.raises(RegistryError, match="max_concurrency"):
        registry.register_action(action)


def test_a_forked_worker_process_makes_calls_with_a_pool_of_its_own():
    # A django-q2 cluster forks its workers from a process that may have made calls.
    assert calls.call(lambda: {"ok": True}, budget_ms=2000, what="parent").raw == {"ok": True}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        answer = calls.call(lambda: {"ok": True}, budget_ms=2000, what="child")
        os.write(write, b"answered" if answer.raw == {"ok": True} else b"timed out")
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 20) == b"answered"
