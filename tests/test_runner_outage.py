"""A run whose step meets a module that is down waits for it, and spends no attempt on it."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import outages, registry
from cleanup.models import ModuleEvent, ModuleHealth, RunStatus, Step
from cleanup.runner import advance, start_run
from tests.fakes import FakeAction, Scripted

pytestmark = pytest.mark.django_db

UNAVAILABLE = {"ok": False, "error": "the shard is down", "retry": True, "unavailable": True}
OUTAGE = {
    "EVENT_OUTAGE_AFTER": 2,
    "EVENT_OUTAGE_PROBE_S": 15,
    "EVENT_STEP_MAX_ATTEMPTS": 3,
    "EVENT_STEP_BACKOFF_S": 1,
    "EVENT_OUTAGE_GIVE_UP_S": 3600,
}


def spawn():
    return {"action": "test.spawn", "params": {"creature": "orc"}}


def test_a_step_whose_module_goes_down_waits_and_completes_once_it_is_back():
    perform = Scripted(UNAVAILABLE, UNAVAILABLE, {"ok": True, "resources": [{"kind": "creature", "ref": "orc-1"}]})
    health = Scripted({"ok": False, "error": "still restarting", "unavailable": True}, {"ok": True})
    action = FakeAction(perform=perform)
    action.health = health
    registry.register_action(action)
    start = timezone.now()
    with override_settings(**OUTAGE), time_machine.travel(start, tick=False) as clock:
        run = start_run("invasion", [spawn()])
        advance()  # attempt 1: the shard is down (the module is still up: it counts)
        clock.shift(timedelta(seconds=2))
        advance()  # attempt 2: the second such answer marks the module down; not counted
        step = Step.objects.get(run=run)
        assert (step.status, step.attempts) == ("pending", 1)
        down = ModuleHealth.objects.get(module="test")
        assert step.waiting_since == down.down_since, "the step does not say it waits"
        assert not step.last_error.startswith("waiting"), "waiting is its own field, not text in last_error"
        for _ in range(10):  # ticks while it is down and before the probe is due
            clock.shift(timedelta(seconds=1))
            advance()
        assert len(perform.calls) == 2 and len(health.calls) == 0
        clock.shift(timedelta(seconds=5))
        advance()  # the probe is due: still down
        assert len(health.calls) == 1 and len(perform.calls) == 2
        clock.shift(timedelta(seconds=15))
        advance()  # the probe finds it up, and the step is performed

    run.refresh_from_db()
    step.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert (step.status, step.attempts) == ("done", 2)
    kinds = list(run.log.values_list("kind", flat=True))
    assert kinds.count("step.waiting") == 1, "the wait was told more than once"
    assert "run.aborted" not in kinds
    assert list(ModuleEvent.objects.order_by("id").values_list("kind", flat=True)) == ["module.down", "module.up"]


def test_a_step_of_a_module_marked_down_by_a_person_is_not_performed():
    perform = Scripted({"ok": True, "resources": []})
    registry.register_action(FakeAction(perform=perform))
    outages.mark_down("test", by="alice", reason="shard maintenance")
    with override_settings(**OUTAGE):
        run = start_run("invasion", [spawn()])
        advance()

    assert perform.calls == []
    step = Step.objects.get(run=run)
    assert (step.status, step.attempts) == ("pending", 0)
    assert step.waiting_since is not None and step.last_error == ""
    assert "(shard maintenance)" in run.log.get(kind="step.waiting").detail["reason"]


def test_a_step_still_fails_for_its_own_reasons_while_its_module_answers():
    perform = Scripted({"ok": False, "error": "no such creature", "retry": True})
    registry.register_action(FakeAction(perform=perform))
    start = timezone.now()
    with override_settings(**OUTAGE), time_machine.travel(start, tick=False) as clock:
        run = start_run("invasion", [spawn()])
        for _ in range(4):
            advance()
            clock.shift(timedelta(seconds=10))

    run.refresh_from_db()
    assert run.status == RunStatus.ABORTED
    assert len(perform.calls) == 3
    assert not ModuleEvent.objects.exists()


def test_an_outage_past_the_give_up_bound_stops_holding_the_step():
    perform = Scripted(UNAVAILABLE)
    registry.register_action(FakeAction(perform=perform))
    start = timezone.now()
    with override_settings(**OUTAGE), time_machine.travel(start, tick=False) as clock:
        run = start_run("invasion", [spawn()])
        advance()
        clock.shift(timedelta(seconds=2))
        advance()  # marked down
        clock.shift(timedelta(hours=1, seconds=1))
        for _ in range(5):
            advance()
            clock.shift(timedelta(seconds=30))

    run.refresh_from_db()
    assert run.status == RunStatus.ABORTED
    assert "the shard is down" in Step.objects.get(run=run).last_error
