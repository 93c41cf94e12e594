"""A person's mark-down holds (a maintenance window): probes look and say what they saw, but
only a person marks the backend up, or the end of the hold they set."""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from cleanup import outages, registry
from cleanup.models import ModuleHealth
from tests.fakes import FakeAction, Scripted

pytestmark = pytest.mark.django_db


@pytest.fixture
def module():
    action = FakeAction()
    action.health = Scripted({"ok": True, "boot_id": "boot-1"})
    registry.register_action(action)
    return action


def state():
    return ModuleHealth.objects.get(module="test").state


def test_a_successful_probe_does_not_undo_a_persons_mark_down(module):
    start = timezone.now()
    with override_settings(EVENT_OUTAGE_PROBE_S=15), time_machine.travel(start, tick=False) as clock:
        outages.mark_down("test", by="alice", reason="maintenance")
        clock.shift(timedelta(seconds=16))
        assert outages.probe("test") == "down"
        assert outages.record("test", None) is False  # an answer that does not blame it either

    health = ModuleHealth.objects.get(module="test")
    assert health.state == "down" and health.held
    assert health.last_probe == "answers (boot id boot-1)", "the probe says what it saw"
    assert len(module.health.calls) == 1

    assert outages.mark_up("test", by="alice") is True, "a person ends the hold"
    health.refresh_from_db()
    assert (health.state, health.held) == ("up", False)


def test_a_held_backend_without_health_gets_no_canary_call():
    registry.register_action(FakeAction())
    start = timezone.now()
    with override_settings(EVENT_OUTAGE_PROBE_S=15), time_machine.travel(start, tick=False) as clock:
        outages.mark_down("test", by="alice", reason="maintenance")
        clock.shift(timedelta(seconds=16))
        assert outages.probe("test") == "down"


def test_a_hold_with_an_end_yields_to_the_probe_after_it(module):
    start = timezone.now()
    with override_settings(EVENT_OUTAGE_PROBE_S=15), time_machine.travel(start, tick=False) as clock:
        outages.mark_down("test", by="alice", reason="deploy", until=start + timedelta(minutes=1))
        clock.shift(timedelta(seconds=16))
        assert outages.probe("test") == "down"
        clock.shift(timedelta(seconds=60))
        assert outages.probe("test") == "up"
    assert state() == "up"


def test_an_outage_the_engine_found_still_ends_at_the_first_good_probe(module):
    start = timezone.now()
    with (
        override_settings(EVENT_OUTAGE_PROBE_S=15, EVENT_OUTAGE_AFTER=1),
        time_machine.travel(start, tick=False) as clock,
    ):
        outages.record("test", "connection refused")
        clock.shift(timedelta(seconds=16))
        assert outages.probe("test") == "up"


def test_the_api_takes_the_holds_end_and_refuses_one_in_the_past(module, django_user_model):
    staff = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw-for-tests-only")
    client = APIClient()
    client.force_authenticate(staff)
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    refused = client.post("/api/v1/events/modules/test/down/", {"reason": "deploy", "until": past}, format="json")
    assert refused.status_code == 400 and "until" in refused.json()["errors"]
    until = timezone.now() + timedelta(hours=1)
    answer = client.post(
        "/api/v1/events/modules/test/down/", {"reason": "deploy", "until": until.isoformat()}, format="json"
    )
    assert answer.status_code == 200
    health = ModuleHealth.objects.get(module="test")
    assert health.held and abs((health.held_until - until).total_seconds()) < 1
