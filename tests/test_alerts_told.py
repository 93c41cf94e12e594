"""Alerts say where they went (issue 21, item 8): "staff told" only once a mail or webhook
was accepted; with no destination set, the admin index says alerts go nowhere and how to
set them."""

import pytest
from django.contrib.auth.models import User
from django.core import mail

from cleanup import alerts, outages, registry
from cleanup.models import Alert, ModuleEvent
from tests.fakes import FakeAction

pytestmark = pytest.mark.django_db

NOWHERE = "Alerts go nowhere"


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


@pytest.fixture
def outage():
    registry.register_action(FakeAction())
    outages.mark_down("test", by="alice", reason="deploy")
    return ModuleEvent.objects.get(kind="module.down")


def staff_told(client, event):
    page = client.get(f"/admin/cleanup/moduleevent/{event.pk}/change/").content.decode()
    return page.lower().split("staff told", 1)[1][:400]


def test_with_no_destination_a_change_is_not_said_told_and_the_index_says_alerts_go_nowhere(staff, outage, settings):
    settings.ADMINS = []
    settings.EVENT_ALERT_WEBHOOK_URL = ""
    alerts.notice()
    outage.refresh_from_db()
    assert outage.alerted_at is not None and outage.told_at is None
    assert not Alert.objects.exists()
    assert "not told: no alert destination was set" in staff_told(staff, outage)
    listed = staff.get("/admin/cleanup/moduleevent/").content.decode()
    assert "not told: no alert destination was set" in listed

    index = staff.get("/admin/").content.decode()
    assert NOWHERE in index and "ADMINS" in index and "EVENT_ALERT_WEBHOOK_URL" in index


def test_a_change_reads_told_once_its_mail_was_accepted_and_not_before(staff, outage, settings):
    settings.ADMINS = [("Ops", "ops@example.com")]
    alerts.notice(deliver_now=False)
    outage.refresh_from_db()
    assert outage.told_at is None
    assert "not yet sent" in staff_told(staff, outage)

    assert alerts.deliver() == 1
    outage.refresh_from_db()
    assert len(mail.outbox) == 1 and outage.told_at is not None
    assert "not yet sent" not in staff_told(staff, outage) and "not told" not in staff_told(staff, outage)
    assert NOWHERE not in staff.get("/admin/").content.decode()

    answer = staff.get("/api/events/modules/log/").json()
    assert answer["results"][0]["told_at"]
