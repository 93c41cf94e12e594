"""No two calls for one group overlap: a call that outlives its budget holds its rows until it ends."""

import threading
import time
from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import registry
from cleanup.models import Resource
from cleanup.sweep import dispatch, sweep
from tests.fakes import FakeAction, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db(transaction=True)


class Hanging:
    """A revert that blocks until released, counting its calls and how many overlap."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def __call__(self, **kwargs):
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.release.wait(30)
        with self.lock:
            self.running -= 1
        return {"ok": True, "failed": []}


def wait_until(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@override_settings(EVENT_REVERT_BACKOFF_S=0, EVENT_CLAIM_TIMEOUT_S=60)
def test_a_call_past_its_budget_is_not_retried_while_it_still_runs():
    revert = Hanging()
    registry.register_action(FakeAction(revert=revert, budget_ms=50))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    try:
        sweep()
        row = Resource.objects.get(run=run)
        assert row.state == "failed"
        assert row.last_error == "test.spawn did not answer within 50 ms", "the reason is not visible"

        sweep()
        with time_machine.travel(timezone.now() + timedelta(seconds=300), tick=False):
            dispatch.keep_overdue_claims()  # the keeper renews the claim of a call still running
            sweep()
        assert revert.calls == 1, "the group was retried while its first call still ran"
    finally:
        revert.release.set()
    wait_until(lambda: revert.running == 0)
    dispatch.keep_overdue_claims()  # the call ended: its rows go back to the sweep

    sweep()
    assert revert.calls == 2
    assert revert.most_at_once == 1
    assert Resource.objects.get(run=run).state == "reverted"
