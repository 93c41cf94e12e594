"""Rule 5: a failing revert is tried exactly EVENT_REVERT_MAX_ATTEMPTS times, spaced out."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import registry
from cleanup.models import CleanupStatus, Resource
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

DOWN = {"ok": False, "error": "shard is down", "retry": True}


def test_it_tries_exactly_max_attempts_then_leaves_the_run_incomplete():
    revert = Scripted(DOWN)
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])
    start = timezone.now()

    with override_settings(EVENT_REVERT_MAX_ATTEMPTS=3, EVENT_REVERT_BACKOFF_S=10):
        seen = []
        with time_machine.travel(start, tick=False) as clock:
            for _ in range(6):
                sweep()
                run.refresh_from_db()
                seen.append((len(revert.calls), run.cleanup_status))
                clock.shift(timedelta(minutes=5))

    assert seen == [
        (1, CleanupStatus.PENDING),
        (2, CleanupStatus.PENDING),
        (3, CleanupStatus.INCOMPLETE),
        (3, CleanupStatus.INCOMPLETE),
        (3, CleanupStatus.INCOMPLETE),
        (3, CleanupStatus.INCOMPLETE),
    ]
    rows = Resource.objects.filter(run=run).exclude(kind="step")
    assert {(r.state, r.revert_attempts, r.last_error) for r in rows} == {("failed", 3, "shard is down")}


def test_it_waits_out_the_backoff_between_attempts():
    revert = Scripted(DOWN)
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])
    start = timezone.now()

    with override_settings(EVENT_REVERT_BACKOFF_S=30), time_machine.travel(start, tick=False) as clock:
        sweep()
        clock.shift(timedelta(seconds=29))
        sweep()
        assert len(revert.calls) == 1, "a second attempt came before the backoff"
        clock.shift(timedelta(seconds=2))
        sweep()
        assert len(revert.calls) == 2
        # The backoff doubles: the third attempt waits 60 s after the second.
        clock.shift(timedelta(seconds=59))
        sweep()
        assert len(revert.calls) == 2
        clock.shift(timedelta(seconds=2))
        sweep()
        assert len(revert.calls) == 3


def test_it_recovers_when_the_module_answers_on_a_later_attempt():
    revert = Scripted(DOWN, {"ok": True, "failed": []})
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    with override_settings(EVENT_REVERT_BACKOFF_S=0):
        sweep()
        sweep()

    run.refresh_from_db()
    assert run.cleanup_status == CleanupStatus.COMPLETE
    assert set(Resource.objects.filter(run=run).values_list("state", "revert_attempts")) == {("reverted", 2)}
