"""Staff are told once when a module's backend goes down and once when it comes back, not once per run."""

import threading

import pytest
from django.core import mail
from django.test import override_settings

from cleanup import alerts, outages, registry
from cleanup.models import Alert, ModuleEvent, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

ADMINS = [("Ops", "ops@example.com")]
REFUSED = "the shard could not be reached: connection refused"


@pytest.fixture
def module(settings):
    settings.ADMINS = ADMINS
    settings.EVENT_SITE_URL = "https://events.example.com"
    registry.register_action(FakeAction())
    return "test"


def test_an_outage_is_told_once_when_it_begins_and_once_when_it_ends_whatever_the_runs(module):
    for n in range(5):  # five ended runs held up by the same outage
        make_rows(make_step(make_run(status=RunStatus.ABORTED, name=f"raid {n}")), [f"orc-{n}"], placeholder=False)
    with override_settings(EVENT_OUTAGE_AFTER=3):
        for _ in range(6):
            outages.record(module, REFUSED)
    assert alerts.notice() == 1
    assert alerts.notice() == 0
    assert len(mail.outbox) == 1
    down = mail.outbox[0]
    assert "Module test is down" in down.subject
    assert REFUSED in down.body and "Unresolved rows of ended runs on test: 5" in down.body
    assert "https://events.example.com/admin/cleanup/modulehealth/" in down.body

    outages.mark_up(module, by="probe")
    assert alerts.notice() == 1 and alerts.notice() == 0
    assert len(mail.outbox) == 2 and "Module test is up again" in mail.outbox[1].subject
    assert "marked up by probe" in mail.outbox[1].body
    assert list(Alert.objects.order_by("id").values_list("event", "module", "run")) == [
        ("module.down", "test", None),
        ("module.up", "test", None),
    ]


def test_one_backend_down_is_told_by_its_name_with_its_own_rows(module):
    from cleanup.models import Resource

    for n, backend in enumerate(["north", "north", "south"]):
        [row] = make_rows(make_step(make_run(status=RunStatus.ABORTED)), [f"orc-{n}"], placeholder=False)
        Resource.objects.filter(pk=row.pk).update(backend=backend)
    outages.mark_down(module, backend="north", by="alice", reason="redeploying north")
    assert alerts.notice() == 1
    down = mail.outbox[0]
    assert "Module test/north is down" in down.subject
    assert "Unresolved rows of ended runs on test/north: 2" in down.body
    assert Alert.objects.get().payload["backend"] == "north"


def test_a_person_marking_a_module_down_is_told_with_their_reason(module):
    outages.mark_down(module, by="alice", reason="redeploying the shard")
    alerts.notice()
    assert "marked down by alice: redeploying the shard" in mail.outbox[0].body


def test_the_webhook_gets_the_module_change_as_json(module, settings):
    from tests.test_alerts import Receiver

    receiver = Receiver()
    settings.EVENT_ALERT_WEBHOOK_URL = receiver.url
    try:
        outages.mark_down(module, by="alice", reason="deploy")
        alerts.notice()
    finally:
        receiver.stop()
    (body,) = receiver.bodies
    assert (body["event"], body["module"], body["by"], body["error"]) == ("module.down", "test", "alice", "deploy")
    assert body["down_since"] and body["url"].endswith("/admin/cleanup/modulehealth/")


def test_without_a_channel_the_change_is_claimed_and_nothing_is_queued(module, settings):
    settings.ADMINS = []
    outages.mark_down(module, by="alice", reason="deploy")
    assert alerts.notice() == 1
    assert not Alert.objects.exists() and ModuleEvent.objects.get().alerted_at is not None


def test_a_gave_up_entry_is_not_told_as_a_change(module):
    ModuleEvent.objects.create(module=module, kind="module.gave_up", detail={"by": "engine"})
    assert alerts.notice() == 0 and not Alert.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_several_senders_tell_one_module_change_once(settings):

    settings.ADMINS = ADMINS
    outages.mark_down("test", by="alice", reason="deploy")
    outages.mark_up("test", by="bob")
    barrier = threading.Barrier(4)
    told = []

    def sender():
        from django.db import connections

        try:
            barrier.wait()
            told.append(alerts.notice_modules())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sender) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(told) == 2 and len(told) == 4
    assert sorted(Alert.objects.values_list("event", flat=True)) == ["module.down", "module.up"]
    alerts.deliver()
    alerts.deliver()
    assert len(mail.outbox) == 2
