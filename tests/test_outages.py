"""A module's backend health: answers that blame the backend, marking down and up, probes."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import outages, registry
from cleanup.calls import Answer
from cleanup.models import Attempt, ModuleEvent, ModuleHealth, Resource
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

REFUSED = "the shard could not be reached: connection refused"


def events(module="test"):
    return list(ModuleEvent.objects.filter(module=module).order_by("id").values_list("kind", flat=True))


def state(module="test"):
    return ModuleHealth.objects.get(module=module).state


@pytest.mark.parametrize(
    "answer, blamed",
    [
        (
            Answer(timed_out=True, exception="test.spawn did not answer within 100 ms"),
            "test.spawn did not answer within 100 ms",
        ),
        (Answer(raw={"ok": False, "error": "shard is down", "retry": True, "unavailable": True}), "shard is down"),
        (Answer(raw={"ok": False, "unavailable": True}), "the backend is unavailable"),
        (Answer(raw={"ok": False, "error": "no such creature", "retry": False}), None),
        (Answer(raw={"ok": False, "error": "busy", "retry": True, "unavailable": "yes"}), None),
        (Answer(raw={"ok": True, "failed": []}), None),
        (Answer(exception="test.spawn raised KeyError: 'x'"), None),
        (Answer(raw=None), None),
    ],
)
def test_it_tells_an_answer_that_blames_the_backend_from_one_about_the_row(answer, blamed):
    assert outages.blame(answer) == blamed


def test_it_marks_a_module_down_after_enough_blaming_answers_in_a_row_and_logs_it_once():
    with override_settings(EVENT_OUTAGE_AFTER=3):
        assert outages.record("test", REFUSED) is False
        assert outages.record("test", REFUSED) is False
        assert outages.record("test", REFUSED) is True
        assert outages.record("test", REFUSED) is False  # already down: no second entry

    health = ModuleHealth.objects.get(module="test")
    assert (health.state, health.last_error, health.failures_in_row) == ("down", REFUSED, 4)
    assert health.down_since is not None and health.next_probe_at > health.down_since
    assert events() == ["module.down"]
    assert outages.down_modules() == {"test"}


def test_it_starts_counting_again_after_an_answer_about_a_row():
    with override_settings(EVENT_OUTAGE_AFTER=3):
        outages.record("test", REFUSED)
        outages.record("test", REFUSED)
        outages.record("test", None)  # the backend answered, if only to refuse a row
        outages.record("test", REFUSED)
        outages.record("test", REFUSED)

    assert state() == "up"
    assert events() == []


def test_it_counts_each_module_apart():
    with override_settings(EVENT_OUTAGE_AFTER=2):
        outages.record("test", REFUSED)
        outages.record("other", REFUSED)
        outages.record("test", REFUSED)

    assert outages.down_modules() == {"test"}


def test_it_gives_back_the_attempts_spent_by_the_answers_that_led_to_the_outage():
    run = make_run()
    rows = make_rows(make_step(run), ["orc-1", "orc-2", "orc-3"], placeholder=False)
    start = timezone.now()
    with override_settings(EVENT_OUTAGE_AFTER=3), time_machine.travel(start, tick=False) as clock:
        earlier = rows[2]
        Resource.objects.filter(pk=earlier.pk).update(state="failed", revert_attempts=1)
        Attempt.record([Resource.objects.get(pk=earlier.pk)], "retry", "no such creature yet")
        clock.shift(timedelta(seconds=1))
        for row in rows:
            Resource.objects.filter(pk=row.pk).update(state="failed", revert_attempts=row.pk - rows[0].pk + 1)
            outages.record("test", REFUSED)
            Attempt.record([Resource.objects.get(pk=row.pk)], outages.UNAVAILABLE, REFUSED)
            clock.shift(timedelta(seconds=1))

    # The third answer marked the module down before its own attempt was recorded (the
    # engine does not count that one); the first two, and only those, are given back.
    attempts = dict(Resource.objects.filter(run=run).values_list("ref", "revert_attempts"))
    assert attempts == {"orc-1": 0, "orc-2": 1, "orc-3": 3}
    assert ModuleEvent.objects.get(kind="module.down").detail["forgiven"] == 2


def test_it_lets_one_worker_probe_per_interval():
    with override_settings(EVENT_OUTAGE_AFTER=1, EVENT_OUTAGE_PROBE_S=15):
        start = timezone.now()
        with time_machine.travel(start, tick=False) as clock:
            outages.record("test", REFUSED)
            assert outages.take_probe("test") is False  # not due yet
            clock.shift(timedelta(seconds=15))
            assert outages.take_probe("test") is True
            assert outages.take_probe("test") is False  # a second worker, same moment
            clock.shift(timedelta(seconds=14))
            assert outages.take_probe("test") is False
            clock.shift(timedelta(seconds=1))
            assert outages.take_probe("test") is True


def test_a_probe_through_health_marks_the_module_up_and_resumes_its_rows_spread_out():
    health = Scripted({"ok": False, "error": "still restarting", "unavailable": True}, {"ok": True})
    action = FakeAction()
    action.health = health
    registry.register_action(action)
    run = make_run()
    for step in range(10):
        make_rows(make_step(run), [f"orc-{step}-{i}" for i in range(4)], placeholder=False)
    start = timezone.now()
    with (
        override_settings(EVENT_OUTAGE_AFTER=1, EVENT_OUTAGE_PROBE_S=15, EVENT_OUTAGE_SPREAD_S=5),
        time_machine.travel(start, tick=False) as clock,
    ):
        outages.record("test", REFUSED)
        clock.shift(timedelta(seconds=15))
        assert outages.probe_due_modules() == set()
        assert state() == "down"
        assert ModuleHealth.objects.get(module="test").last_error == "still restarting"
        clock.shift(timedelta(seconds=15))
        assert outages.probe_due_modules() == set()
        up_at = timezone.now()

    assert state() == "up"
    assert len(health.calls) == 2
    assert events() == ["module.down", "module.up"]
    due = sorted(Resource.objects.filter(run=run).values_list("next_attempt_at", flat=True))
    assert due[0] == up_at and up_at < due[-1] <= up_at + timedelta(seconds=5)
    assert len(set(due)) > 1, "all the waiting rows would resume at the same instant"
    # One step's rows resume together: its group is given back by one call, not split.
    by_step = {}
    for step_id, at in Resource.objects.filter(run=run).values_list("step_id", "next_attempt_at"):
        by_step.setdefault(step_id, set()).add(at)
    assert all(len(times) == 1 for times in by_step.values()), by_step


def test_a_probe_without_health_lets_one_canary_call_through():
    registry.register_action(FakeAction())
    with override_settings(EVENT_OUTAGE_AFTER=1, EVENT_OUTAGE_PROBE_S=15):
        start = timezone.now()
        with time_machine.travel(start, tick=False) as clock:
            outages.record("test", REFUSED)
            clock.shift(timedelta(seconds=16))
            assert outages.probe_due_modules() == {"test"}
            assert outages.probe_due_modules() == set()  # one canary per interval
            outages.record("test", None)  # the canary's answer came back

    assert state() == "up"


def test_rows_whose_own_backoff_ends_later_keep_it_when_the_module_comes_back():
    run = make_run()
    [row] = make_rows(make_step(run), ["orc-1"], placeholder=False)
    later = timezone.now() + timedelta(minutes=10)
    Resource.objects.filter(pk=row.pk).update(state="failed", next_attempt_at=later)
    outages.mark_down("test", by="alice", reason="shard maintenance")

    outages.mark_up("test", by="alice")

    assert Resource.objects.get(pk=row.pk).next_attempt_at == later


def test_a_person_marks_a_module_down_and_up_and_both_are_logged():
    assert outages.mark_down("test", by="alice", reason="shard maintenance") is True
    assert outages.mark_down("test", by="bob") is False
    assert "waiting: test is down since" in ModuleHealth.objects.get(module="test").waiting_text()
    assert "(shard maintenance)" in ModuleHealth.objects.get(module="test").waiting_text()
    assert outages.mark_up("test", by="bob") is True
    assert outages.mark_up("test", by="bob") is False

    log = list(ModuleEvent.objects.order_by("id").values_list("kind", "detail__by"))
    assert log == [("module.down", "alice"), ("module.up", "bob")]


def test_an_outage_past_the_give_up_bound_is_answered_once():
    start = timezone.now()
    with (
        override_settings(EVENT_OUTAGE_AFTER=1, EVENT_OUTAGE_GIVE_UP_S=3600),
        time_machine.travel(start, tick=False) as clock,
    ):
        outages.record("test", REFUSED)
        clock.shift(timedelta(minutes=59))
        assert outages.outages_past_give_up() == []
        clock.shift(timedelta(minutes=2))
        [health] = outages.outages_past_give_up()
        assert outages.outages_past_give_up() == []
        assert "test was down for more than 60 min" in outages.give_up_text(health)

    assert events() == ["module.down", "module.gave_up"]


def test_one_group_that_keeps_timing_out_does_not_mark_its_module_down():
    with override_settings(EVENT_OUTAGE_AFTER=3):
        for _ in range(5):
            outages.record("test", "test.spawn did not answer within 100 ms", key="step:7", ambiguous=True)
        assert state() == "up"
        outages.record("test", "test.spawn did not answer within 100 ms", key="step:8", ambiguous=True)
        outages.record("test", "test.spawn did not answer within 100 ms", key="step:9", ambiguous=True)

    assert state() == "down"


def test_a_backend_that_says_it_is_unavailable_counts_whatever_the_group():
    with override_settings(EVENT_OUTAGE_AFTER=3):
        for _ in range(3):
            outages.record("test", "the shard is down", key="step:7")

    assert state() == "down"
