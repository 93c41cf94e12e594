"""A ledger row, and a step, say what will happen to them: waiting for a backend is its own
field, and a row with no attempt left has no next attempt and is not retryable (issue 19,
item 6)."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import outages, registry
from cleanup.models import Resource
from cleanup.runner import start_run, tick
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db

API = "/api/events/"
DOWN = {"ok": False, "error": "the orc is in combat", "retry": True}


def test_a_row_at_the_attempt_ceiling_has_no_next_attempt_and_is_not_retryable():
    registry.register_action(FakeAction(revert=Scripted(DOWN)))
    run = make_run()
    [row] = make_rows(make_step(run), ["orc-1"], placeholder=False)
    client = api_as("view_resource")
    start = timezone.now()
    with override_settings(EVENT_REVERT_MAX_ATTEMPTS=2, EVENT_REVERT_BACKOFF_S=10):
        with time_machine.travel(start, tick=False) as clock:
            sweep()
            row.refresh_from_db()
            assert row.next_attempt_at is not None, "a row with an attempt left waits out its backoff"
            answer = client.get(API + f"resources/{row.pk}/").json()
            assert answer["retryable"] is True and answer["next_attempt_at"]
            clock.shift(timedelta(minutes=5))
            sweep()
        row.refresh_from_db()
        assert (row.state, row.revert_attempts, row.next_attempt_at) == ("failed", 2, None)
        answer = client.get(API + f"resources/{row.pk}/").json()
        assert (answer["retryable"], answer["next_attempt_at"]) == (False, None)
        listed = client.get(API + "resources/").json()["results"][0]
        assert (listed["retryable"], listed["next_attempt_at"]) == (False, None)


def test_a_row_waiting_for_its_backend_says_so_in_its_own_field_not_in_its_error():
    registry.register_action(FakeAction(revert=Scripted(DOWN)))
    run = make_run()
    [row] = make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.filter(pk=row.pk).update(last_error="the orc is in combat")
    client = api_as("view_resource")
    assert client.get(API + f"resources/{row.pk}/").json()["waiting"] is None

    outages.mark_down("test", by="alice", reason="maintenance")

    answer = client.get(API + f"resources/{row.pk}/").json()
    assert set(answer["waiting"]) == {"backend", "since", "reason"}
    assert (answer["waiting"]["backend"], answer["waiting"]["reason"]) == ("test", "maintenance")
    assert answer["waiting"]["since"].endswith("Z")
    assert answer["last_error"] == "the orc is in combat", "the row's own error is left as it was"


def test_a_step_waiting_for_its_backend_says_so_in_its_own_field_not_in_its_error():
    registry.register_action(FakeAction())
    outages.mark_down("test", by="alice", reason="maintenance")
    run = start_run("held", [{"action": "test.spawn", "params": {"count": 1}}])
    tick()
    client = api_as("view_run")

    [step] = client.get(API + f"runs/{run.pk}/").json()["steps"]

    assert step["status"] == "pending" and step["last_error"] == ""
    assert (step["waiting"]["backend"], step["waiting"]["reason"]) == ("test", "maintenance")
    outages.mark_up("test", by="alice")
    tick()
    [step] = client.get(API + f"runs/{run.pk}/").json()["steps"]
    assert (step["status"], step["waiting"]) == ("done", None)
