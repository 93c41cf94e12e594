"""Pacing: an action's max_rate and max_burst, kept per backend by every process together."""

import threading
import time

import pytest
from django.db import connections
from django.test import override_settings

from cleanup import outages, pacing, registry
from cleanup.models import ModuleHealth

pytestmark = pytest.mark.django_db(transaction=True)


class LimitedBackend:
    """A backend that keeps `burst` requests at once, then `rate` a second, and drops the rest
    in silence (as an ioquake3 server drops rcon): a dropped request answers `unavailable`."""

    def __init__(self, rate, burst):
        self.interval = 1.0 / rate
        self.burst = burst
        self.tat = 0.0
        self.lock = threading.Lock()
        self.answered = 0
        self.dropped = 0

    def request(self):
        with self.lock:
            now = time.monotonic()
            tat = max(self.tat, now) + self.interval
            if tat - self.burst * self.interval > now + 0.05:  # a little slack for the clocks
                self.dropped += 1
                return False
            self.tat = tat
            self.answered += 1
            return True


class Ping(registry.Action):
    module = "paced"

    def __init__(self, backend, max_rate=None, max_burst=None):
        self.id = f"paced.ping.{max_rate}"
        self.backend = backend
        self.max_rate, self.max_burst = max_rate, max_burst

    def perform(self, *, run_id, step_id, params, idempotency_key, backend=""):
        if self.backend.request():
            return {"ok": True, "resources": []}
        return {"ok": False, "error": "the backend did not answer", "retry": True, "unavailable": True}


def burst_of(action, calls):
    answers = []
    for n in range(calls):
        answers.append(
            outages.call(
                action,
                action.perform,
                budget_ms=5_000,
                what=f"burst {n}",
                backend="north",
                run_id=0,
                step_id=0,
                params={},
                idempotency_key=f"k{n}",
            )
        )
    return answers


def down(module):
    return ModuleHealth.objects.down().filter(module=module, backend="north").exists()


@pytest.mark.slow
def test_a_burst_of_30_past_max_rate_is_paced_and_marks_nothing_down():
    backend = LimitedBackend(rate=1, burst=10)
    action = Ping(backend, max_rate=1, max_burst=10)
    began = time.monotonic()
    with override_settings(EVENT_OUTAGE_AFTER=3, REDIS_URL=""):
        answers = burst_of(action, 30)
    elapsed = time.monotonic() - began
    assert all(a.raw == {"ok": True, "resources": []} for a in answers), [
        a.raw for a in answers if a.raw["ok"] is not True
    ]
    assert backend.dropped == 0 and backend.answered == 30
    assert 15 <= elapsed <= 40, elapsed  # 10 at once, then 20 at one a second
    assert not down("paced")


def test_without_max_rate_the_same_burst_is_dropped_and_marks_the_backend_down():
    backend = LimitedBackend(rate=1, burst=10)
    action = Ping(backend)
    with override_settings(EVENT_OUTAGE_AFTER=3):
        answers = burst_of(action, 20)
    assert backend.dropped >= 3, backend.dropped
    assert sum(a.raw["ok"] is not True for a in answers) == backend.dropped
    assert down("paced")


@pytest.mark.parametrize("store", ["database", "redis"])
def test_turns_are_shared_by_callers_on_separate_connections(store):
    """Two callers (threads, each with its own connection, as two processes would) take
    turns from one schedule: at 10 a second, one at once, no two turns fall within a tenth
    of a second of each other, whoever takes them."""
    url = "redis://127.0.0.1:6379/0" if store == "redis" else ""
    module = f"shared-{store}-{time.monotonic_ns()}"
    due = []
    lock = threading.Lock()

    def take():
        try:
            for _ in range(10):
                wait = pacing.reserve(module, "north", rate=10.0, burst=1)
                with lock:
                    due.append(time.monotonic() + wait)
        finally:
            connections.close_all()

    with override_settings(REDIS_URL=url):
        threads = [threading.Thread(target=take) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    due.sort()
    gaps = [b - a for a, b in zip(due, due[1:], strict=False)]
    assert len(due) == 20 and min(gaps) > 0.05, gaps  # a tenth apart, give or take the load
    assert due[-1] - due[0] >= 1.8


def test_a_store_that_cannot_be_reached_paces_nothing():
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        assert pacing.reserve("nowhere", "north", rate=0.001, burst=1) == 0.0
        assert pacing.reserve("nowhere", "north", rate=0.001, burst=1) == 0.0


def test_max_rate_and_max_burst_are_checked_at_registration():
    class Bad(registry.Action):
        id = "bad.rate"
        module = "bad"

        def perform(self, **kwargs):
            return {"ok": True}

    for rate, burst, message in [
        (0, None, "max_rate must be a positive number"),
        ("fast", None, "max_rate must be a positive number"),
        (1, 0, "max_burst must be a positive whole number"),
        (None, 5, "max_burst needs a max_rate"),
    ]:
        entry = Bad()
        entry.max_rate, entry.max_burst = rate, burst
        with pytest.raises(registry.RegistryError, match=message):
            registry.register_action(entry)


def test_a_paced_revert_waiting_for_its_turn_has_spent_no_attempt():
    """An attempt is spent by a call made: a claim of several groups marks them called as
    one shared claim (rule 20), so a row still waiting for its turn when its sweeper dies gets
    its attempt back (`rows.spent_dead_claim` spends only a claim marked alone)."""
    from cleanup.models import Resource
    from cleanup.sweep import sweep
    from tests.fakes import FakeAction, make_rows, make_run, make_step

    marked_at_each_call = []

    class Paced(FakeAction):
        max_rate, max_burst = 5.0, 1

        def revert(self, **kwargs):
            creatures = Resource.objects.filter(kind="creature")
            marked_at_each_call.append(
                (
                    creatures.filter(claim_called=True).count(),
                    creatures.filter(claim_shared=False, claim_called=True).count(),
                )
            )
            connections.close_all()
            return {"ok": True, "failed": []}

    paced = Paced()
    del paced.revert  # FakeAction sets one per instance: this class's own method is the revert
    registry.register_action(paced)
    run = make_run()
    for n in range(4):
        make_rows(make_step(run, position=n), [f"orc-{n}"])
    began = time.monotonic()
    with override_settings(REDIS_URL="", EVENT_REVERT_BACKOFF_S=0):
        sweep()
    # Every call found the four rows marked, none of them alone: none would be spent by a death.
    assert marked_at_each_call == [(4, 0)] * 4
    assert time.monotonic() - began >= 0.5  # three waits of a fifth of a second
    assert set(Resource.objects.filter(kind="creature").values_list("state", "revert_attempts")) == {("reverted", 1)}
