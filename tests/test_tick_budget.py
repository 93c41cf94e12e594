"""A tick stops starting work when its time budget is spent, and queues the next at once."""

from unittest import mock

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import registry
from cleanup.models import Step
from cleanup.runner import start_run, tick
from tests.fakes import FakeAction, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


# One call at a time, so that each answer's 200 s pass before the next group could start.
@override_settings(EVENT_TICK_BUDGET_S=300, EVENT_CALL_CONCURRENCY=1)
def test_the_sweep_starts_no_group_after_the_budget_and_the_tick_queues_another():
    with time_machine.travel(timezone.now(), tick=False) as clock:
        calls = []

        def slow_revert(**kwargs):
            calls.append(kwargs["idempotency_key"])
            clock.shift(200)  # each answer takes 200 s of the tick's 300
            return {"ok": True, "failed": []}

        registry.register_action(FakeAction(revert=slow_revert))
        run = make_run()
        for i in range(4):
            make_rows(make_step(run), [f"orc-{i}"], placeholder=False)

        with mock.patch("cleanup.runner.queue_tick") as queued:
            result = tick()

    assert len(calls) == 2, "a group was started after the budget ran out"
    assert result.work_left and queued.called
    assert sorted(states(run).values()) == ["live", "live", "reverted", "reverted"]


@override_settings(EVENT_TICK_BUDGET_S=300)
def test_the_advance_starts_no_step_after_the_budget():
    with time_machine.travel(timezone.now(), tick=False) as clock:

        def slow_perform(**kwargs):
            clock.shift(200)
            return {"ok": True, "resources": []}

        registry.register_action(FakeAction(perform=slow_perform))
        run = start_run("long", [{"action": "test.spawn", "params": {}} for _ in range(4)])
        with mock.patch("cleanup.runner.queue_tick") as queued:
            result = tick()

    assert list(Step.objects.filter(run=run).values_list("status", flat=True)) == ["done", "done", "pending", "pending"]
    assert result.work_left and queued.called
