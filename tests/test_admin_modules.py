"""The admin's module pages: health, marking down (with a reason) and up, the log, and waiting work shown."""

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup import outages, registry
from cleanup.models import ModuleEvent, ModuleHealth, Resource, RunStatus
from tests.fakes import FakeAction, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:cleanup_modulehealth_changelist"


def staff(*perms, username="staffer"):
    user = User.objects.create_user(username, password="pw-123456789", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="cleanup"))
    return user


@pytest.fixture
def module():
    registry.register_action(FakeAction())
    return "test"


def health_pk(name):
    return ModuleHealth.objects.get_or_create(module=name)[0].pk


def test_it_lists_every_registered_module_with_its_state_since_error_and_next_probe(client, module):
    outages.mark_down(module, by="alice", reason="shard deploy")
    client.force_login(staff("view_modulehealth"))
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert "sandbox" in page, "a registered module never seen failing is not listed"
    row = re.search(r"<tr[^>]*>(?:(?!</tr>).)*>test<(?:(?!</tr>).)*</tr>", page, re.S).group(0)
    health = ModuleHealth.objects.get(module=module)
    assert "down" in row and "shard deploy" in row
    assert health.down_since.astimezone().strftime("%H:%M:%S") in row
    assert health.next_probe_at.astimezone().strftime("%H:%M:%S") in row
    detail = client.get(reverse("admin:cleanup_modulehealth_change", args=[health.pk])).content.decode()
    assert health.waiting_text() in detail and 'name="_save"' not in detail


def test_mark_down_asks_for_a_reason_then_marks_it_down_and_records_who(client, module):
    client.force_login(staff("view_modulehealth", "cleanup_run"))
    pk = health_pk(module)
    asked = client.post(reverse(CHANGELIST), {"action": "mark_down", "_selected_action": [pk]})
    assert asked.status_code == 200 and b'name="reason"' in asked.content and b'name="apply"' in asked.content
    assert ModuleHealth.objects.get(pk=pk).state == "up", "marked down before it was confirmed"

    blank = client.post(
        reverse(CHANGELIST), {"action": "mark_down", "_selected_action": [pk], "apply": "1", "reason": "  "}
    )
    assert blank.status_code == 200 and ModuleHealth.objects.get(pk=pk).state == "up"

    done = client.post(
        reverse(CHANGELIST),
        {"action": "mark_down", "_selected_action": [pk], "apply": "1", "reason": "the shard is being redeployed"},
    )
    assert done.status_code == 302
    health = ModuleHealth.objects.get(pk=pk)
    assert (health.state, health.last_error, health.changed_by) == ("down", "the shard is being redeployed", "staffer")
    event = ModuleEvent.objects.get(module=module)
    assert (event.kind, event.detail["by"]) == ("module.down", "staffer")
    entry = LogEntry.objects.get(object_id=str(pk))
    assert entry.change_message == "Marked down: the shard is being redeployed" and entry.user.username == "staffer"


def test_mark_up_marks_it_up_logs_it_and_says_when_nothing_changed(client, module):
    outages.mark_down(module, by="engine", reason="connection refused")
    client.force_login(staff("view_modulehealth", "cleanup_run"))
    pk = health_pk(module)
    response = client.post(reverse(CHANGELIST), {"action": "mark_up", "_selected_action": [pk]}, follow=True)
    assert ModuleHealth.objects.get(pk=pk).state == "up"
    assert "Marked up: test" in response.content.decode()
    assert list(ModuleEvent.objects.filter(module=module).order_by("id").values_list("kind", flat=True)) == [
        "module.down",
        "module.up",
    ]
    assert LogEntry.objects.get(object_id=str(pk)).change_message == "Marked up"

    again = client.post(reverse(CHANGELIST), {"action": "mark_up", "_selected_action": [pk]}, follow=True)
    assert "Already up, nothing changed: test" in again.content.decode()
    assert ModuleEvent.objects.filter(module=module).count() == 2


def test_marking_needs_the_cleanup_run_permission(client, module):
    client.force_login(staff("view_modulehealth"))
    pk = health_pk(module)
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert "mark_down" not in page and "mark_up" not in page
    client.post(reverse(CHANGELIST), {"action": "mark_down", "_selected_action": [pk], "apply": "1", "reason": "x"})
    assert ModuleHealth.objects.get(pk=pk).state == "up"
    assert not ModuleEvent.objects.exists()


def test_the_modules_log_is_readable_and_read_only(client, module):
    outages.mark_down(module, by="alice", reason="deploy")
    outages.mark_up(module, by="bob")
    client.force_login(staff("view_moduleevent"))
    page = client.get(reverse("admin:cleanup_moduleevent_changelist")).content.decode()
    assert "module.down" in page and "module.up" in page and "alice" in page and "bob" in page
    event = ModuleEvent.objects.filter(kind="module.down").get()
    detail = client.get(reverse("admin:cleanup_moduleevent_change", args=[event.pk])).content.decode()
    assert "deploy" in detail and 'name="_save"' not in detail


def test_the_index_counts_modules_down_with_a_link(client, module):
    client.force_login(staff("view_modulehealth"))
    outages.mark_down(module, by="alice", reason="deploy")
    page = client.get(reverse("admin:index")).content.decode()
    link = re.search(r'<a href="([^"]+)" id="count-modules-down"[^>]*>(\d+)<', page)
    assert link and link.group(2) == "1"
    listed = client.get(link.group(1).replace("&amp;", "&")).content.decode()
    assert "deploy" in listed


@pytest.fixture
def waiting_rows(module):
    ended = make_run(status=RunStatus.ABORTED, name="orc raid", cleanup_status="pending")
    rows = make_rows(make_step(ended), [f"orc-{i}" for i in range(5)], placeholder=False)
    Resource.objects.filter(ref="orc-4").update(state="failed", revert_attempts=3)  # waits for a person instead
    outages.mark_down(module, by="alice", reason="connection refused")
    return ended, rows


def test_the_ledger_list_shows_why_rows_wait_in_one_query_for_the_page(client, waiting_rows):
    client.force_login(staff("view_resource"))
    url = reverse("admin:cleanup_resource_changelist")
    page = client.get(url).content.decode()
    assert page.count("waiting: test is down since") == 4, "only rows the sweep would attempt wait"
    assert "(connection refused)" in page
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    make_rows(make_step(waiting_rows[0]), [f"wolf-{i}" for i in range(20)], placeholder=False)
    with CaptureQueriesContext(connection) as many:
        client.get(url)
    assert len(many) == len(few), "the waiting text is read per row"


def test_the_row_page_and_the_run_page_show_the_waiting_text(client, waiting_rows):
    ended, rows = waiting_rows
    client.force_login(staff("view_resource", "view_run"))
    row_page = client.get(reverse("admin:cleanup_resource_change", args=[rows[0].pk])).content.decode()
    assert "waiting: test is down since" in row_page
    run_page = client.get(reverse("admin:cleanup_run_change", args=[ended.pk])).content.decode()
    assert run_page.count("waiting: test is down since") == 4


def test_a_step_of_a_down_module_shows_the_waiting_text_on_its_run_page(client, module):
    running = make_run(status=RunStatus.RUNNING, name="festival")
    make_step(running, status="pending")
    make_step(running, action_id="core.wait", params={"seconds": 1}, status="pending")
    outages.mark_down(module, by="alice", reason="deploy")
    client.force_login(staff("view_run"))
    page = client.get(reverse("admin:cleanup_run_change", args=[running.pk])).content.decode()
    assert page.count("waiting: test is down since") == 1, "only the step calling the down module waits"
    outages.mark_up(module, by="alice")
    assert "waiting: test" not in client.get(reverse("admin:cleanup_run_change", args=[running.pk])).content.decode()
